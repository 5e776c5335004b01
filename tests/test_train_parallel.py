"""How one process holds the trained model: unwrapped in fp32 (and then bit for bit what FSDP2 over
one process computes), wrapped by FSDP2 in bf16; no FSDP2 warning about a view on any forward; and a
new process group gets a mesh of its own."""

from __future__ import annotations

import random
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: E402

from genesys.train.batch import TrainingSequence, collate  # noqa: E402
from genesys.train.distributed import init_world  # noqa: E402
from genesys.train.logprobs import completion_logprobs  # noqa: E402
from genesys.train.loss import policy_token_loss, reduce_loss  # noqa: E402
from genesys.train.parallel import block_modules, clip_grad_norm, device_mesh, full_tensor, shard_model  # noqa: E402

CPU = torch.device("cpu")


def _load(path: str) -> torch.nn.Module:
    """The model at `path` in fp32 on the CPU, as the trainer trains it (no KV cache)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    return model


def _micro_batch(seed: int):
    """Six sequences of varied prompt and completion lengths (so padding is exercised)."""
    rng = random.Random(seed)
    sequences = []
    for _ in range(6):
        completion = [rng.randrange(3, 300) for _ in range(rng.randint(1, 12))]
        prompt = [rng.randrange(3, 300) for _ in range(rng.randint(2, 9))]
        sequences.append(TrainingSequence(prompt, completion, [-6.0] * len(completion), rng.uniform(-1, 1)))
    return collate(sequences, 0, CPU)


def _train(model: torch.nn.Module, steps: int = 3) -> dict[str, torch.Tensor]:
    """`steps` GRPO updates of `model` (clipped gradients, fused AdamW); its weights after them."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for step in range(steps):
        micro = _micro_batch(step)
        logprobs, _ = completion_logprobs(model, micro, temperature=0.8)
        clipped = policy_token_loss(
            "grpo",
            logprobs,
            micro.old_logprobs,
            micro.advantages,
            micro.completion_mask,
            eps_low=0.2,
            eps_high=0.2,
            delta=4.0,
        )
        reduce_loss(clipped.loss, micro.completion_mask, "token", float(micro.tokens)).backward()
        clip_grad_norm(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {name: full_tensor(p.detach()).clone() for name, p in model.named_parameters()}


def _fully_sharded(model: torch.nn.Module) -> torch.nn.Module:
    """`model` wrapped by FSDP2 over this one process, as every one-process run was before."""
    mesh = device_mesh(init_world(), "fsdp2", CPU)
    for block in block_modules(model):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def test_one_process_in_fp32_trains_unwrapped_and_bit_for_bit_as_fsdp2_would(tiny_model):
    mesh = device_mesh(init_world(), "fsdp2", CPU)
    plain = shard_model(_load(tiny_model), mesh, "fp32")
    assert not isinstance(plain, FSDPModule)
    assert not any(hasattr(p, "full_tensor") for p in plain.parameters())  # plain tensors, no DTensor
    sharded = _fully_sharded(_load(tiny_model))
    ours, theirs = _train(plain), _train(sharded)
    start = dict(_load(tiny_model).named_parameters())
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        assert torch.equal(weight, theirs[name]), name
    assert any(not torch.equal(ours[name], start[name]) for name in ours)  # the weights did move


def test_one_process_in_bf16_is_wrapped_for_its_mixed_precision(tiny_model):
    mesh = device_mesh(init_world(), "fsdp2", CPU)
    assert isinstance(shard_model(_load(tiny_model), mesh, "bf16"), FSDPModule)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_sharded_forward_and_backward_warn_of_no_view(tiny_model, precision):
    """FSDP2 warned "returned a view tensor" on every training forward (hidden_states[0], which the
    trainer never reads); the logprobs' forward silences exactly that warning and nothing else."""
    model = _load(tiny_model)
    mesh = device_mesh(init_world(), "fsdp2", CPU)
    model = shard_model(model, mesh, precision) if precision == "bf16" else _fully_sharded(model)
    model.model.norm.register_forward_hook(
        lambda *_: warnings.warn("another warning of the forward pass", UserWarning, stacklevel=1)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logprobs, _ = completion_logprobs(model, _micro_batch(0), temperature=1.0)
        logprobs.sum().backward()
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "returned a view tensor" in m], messages
    assert "another warning of the forward pass" in messages  # nothing else is silenced


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loaded_model_keeps_its_output_layer_tied_to_the_embeddings(tiny_model, precision):
    """One process in fp32 holds a plain module, whose meta parameters `to_empty` replaced one name at
    a time: the output layer came out as a second, untied copy of the embeddings (the trained model
    had more weights than the checkpoint, and saved both)."""
    from genesys.train.loading import sharded_pretrained

    world = init_world()
    model = sharded_pretrained(tiny_model, world, device_mesh(world, "fsdp2", CPU), precision, CPU)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    want = _load(tiny_model).model.embed_tokens.weight
    assert torch.equal(full_tensor(model.lm_head.weight.detach()), want.detach())


NEW_GROUP_PROBE = """
import torch
import torch.distributed as dist
from genesys.train.distributed import init_world
from genesys.train.parallel import device_mesh

first = device_mesh(init_world(), "fsdp2", torch.device("cpu"))
dist.destroy_process_group()  # as vLLM's teardown does when the last engine closes
second = device_mesh(init_world(), "fsdp2", torch.device("cpu"))
value = torch.tensor([2.0])
dist.all_reduce(value, group=second.get_group())
print(second is not first, second.get_group() is dist.group.WORLD, value.item())
"""


def test_a_process_group_made_after_the_last_one_was_destroyed_gets_a_mesh_of_its_own():
    done = subprocess.run(
        [sys.executable, "-c", NEW_GROUP_PROBE], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "2.0"]
