"""Training in several processes: two CPU processes on gloo (launched with torchrun) end with the
weights of one process with the same global batch, sharded (fsdp2) or replicated (ddp); fsdp2
really shards parameters, gradients and optimizer state; a resumed two-process run ends with the
weights of an uninterrupted one, each rank having written only its own shards; a checkpoint of two
processes resumes in one and one of one process in two (resharded, uneven and empty shards
included); the pretrained model is read by rank 0 alone, so that the other ranks' memory holds their
shards, never the whole model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, read_jsonl, train_arguments, write_jsonl  # noqa: E402

from genesys.testing.digits import digit_tasks  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="torch has no gloo backend",
    ),
    pytest.mark.distributed,
    pytest.mark.slow,
]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _arguments(model: str, tasks: Path, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    # One sequence per generate call: a completion then depends only on its own seed, not on what
    # it was batched with, so both layouts sample the very same tokens.
    return train_arguments(model, out, tasks, 3, 4, "--backend-options.batch-size", "1", *extra)


# With an importance correction the old policy's logprobs are recomputed before each batch's first
# update: every rank runs as many forward passes as the rank with the most.
@pytest.mark.parametrize("extra", [(), ("--loss.importance_correction", "tis")], ids=["plain", "tis"])
def test_two_gloo_processes_match_one_process(tiny_model, tmp_path, plugin_env, extra):
    from safetensors.torch import load_file

    tasks = digit_tasks(tmp_path / "tasks.jsonl")
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [GENESYS, *_arguments(tiny_model, tasks, tmp_path / "one", extra)],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    two = subprocess.run(
        [*TORCHRUN, "-m", "genesys.cli", *_arguments(tiny_model, tasks, tmp_path / "two", extra)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]

    one_metrics, two_metrics = (
        read_jsonl(tmp_path / "one" / "metrics.jsonl"),
        read_jsonl(tmp_path / "two" / "metrics.jsonl"),
    )
    assert [m["groups_kept"] for m in two_metrics] == [4, 4, 4]  # both ranks' groups are counted
    for a, b in zip(one_metrics, two_metrics, strict=True):
        assert a["reward_mean"] == pytest.approx(
            b["reward_mean"], abs=1e-9
        )  # the same completions were sampled
        assert a["tokens"] == b["tokens"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    one, two_weights = (
        load_file(tmp_path / "one" / "final" / "model.safetensors"),
        load_file(tmp_path / "two" / "final" / "model.safetensors"),
    )
    start = load_file(Path(tiny_model) / "model.safetensors")
    for name in one:
        assert (one[name] - two_weights[name]).abs().max() <= 1e-5, name
    assert any(not torch.equal(one[name], start[name]) for name in one)  # the weights did move
    # rank 0 wrote the checkpoint, holding both ranks' data positions
    from genesys.train.checkpoint import load_state

    state = load_state(tmp_path / "two" / "checkpoints" / "step-000002")
    assert state["world_size"] == 2 and len(state["ranks"]) == 2


def _recorded(tmp_path: Path) -> Path:
    rows = [
        {
            "problem_id": f"t{task}",
            "prompt": f"task {task}",
            "prompt_ids": [10 + task, 20, 30][: 1 + task % 3],
            "completion_ids": [40 + sample, 50 + task, 60, 70 + sample][: 1 + (task + sample) % 4],
            "completion_logprobs": [-6.0, -6.0, -6.0, -6.0][: 1 + (task + sample) % 4],
            "reward": float(sample % 2),
        }
        for task in range(8)
        for sample in range(4)
    ]
    return write_jsonl(tmp_path / "rollouts.jsonl", rows)


def _offline(model: str, rollouts: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        "--model",
        model,
        "-o",
        str(out),
        f"--data.rollouts={rollouts}",
        "--rollout.prompts_per_step",
        "4",
        "--optim.steps",
        str(steps),
        "--optim.lr",
        "3e-3",
        "--optim.max_grad_norm",
        "1.0",
        "--optim.micro_batch_size",
        "3",
        "--checkpoint.every",
        "1",
        "--checkpoint.keep",
        "5",
        "--no-progress",
        *extra,
    ]


def _run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_ddp_in_two_processes_matches_one_process_and_a_resumed_fsdp2_run_an_uninterrupted_one(
    tiny_model, tmp_path, plugin_env
):
    from safetensors.torch import load_file

    from genesys.train.checkpoint import load_state

    rollouts = _recorded(tmp_path)
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    two = [*TORCHRUN, "-m", "genesys.cli"]
    _run([GENESYS, *_offline(tiny_model, rollouts, tmp_path / "one", 3)], env)
    _run([*two, *_offline(tiny_model, rollouts, tmp_path / "ddp", 3, "--parallel.strategy", "ddp")], env)
    one, ddp = (load_file(tmp_path / name / "final" / "model.safetensors") for name in ("one", "ddp"))
    for name in one:
        assert (one[name] - ddp[name]).abs().max() <= 1e-5, name

    _run([*two, *_offline(tiny_model, rollouts, tmp_path / "straight", 3)], env)
    resumed = tmp_path / "resumed"
    _run([*two, *_offline(tiny_model, rollouts, resumed, 2)], env)  # checkpoint step 1, final at 2
    first = resumed / "checkpoints" / "step-000001"
    assert load_state(first)["world_size"] == 2
    files = sorted((first / "state").glob("*.safetensors"))
    assert [file.name for file in files] == [
        f"shard-0000{rank}-model-00001-of-00001.safetensors" for rank in (1, 2)
    ]
    for name in ("model.model.embed_tokens.weight", "optimizer.model.embed_tokens.weight.exp_avg"):
        assert [load_file(file)[name].shape for file in files] == [(256, 64), (256, 64)]  # each its half
    _run([*two, *_offline(tiny_model, rollouts, resumed, 3)], env)  # resumes from step 1
    straight, again = (
        load_file(tmp_path / name / "final" / "model.safetensors") for name in ("straight", "resumed")
    )
    for name in straight:
        assert torch.equal(straight[name], again[name]), name
        assert (straight[name] - one[name]).abs().max() <= 1e-5, name


def test_a_checkpoint_of_two_processes_resumes_in_one_and_one_of_one_process_in_two(
    tiny_model, tmp_path, plugin_env
):
    """Checkpoint step 1 falls inside a batch (two updates per batch): the batch's sequences, the data
    position, the weights and the optimizer state all carry over to the other number of processes."""
    from safetensors.torch import load_file

    from genesys.errors import InputError
    from genesys.train import TrainConfig, train

    rollouts = _recorded(tmp_path)
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    extra = ("--optim.updates-per-batch", "2")
    one, two = [GENESYS], [*TORCHRUN, "-m", "genesys.cli"]
    _run([*one, *_offline(tiny_model, rollouts, tmp_path / "straight", 3, *extra)], env)
    for first, then, name in ((two, one, "two-then-one"), (one, two, "one-then-two")):
        _run([*first, *_offline(tiny_model, rollouts, tmp_path / name, 2, *extra)], env)
        _run([*then, *_offline(tiny_model, rollouts, tmp_path / name, 3, *extra)], env)
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    straight_metrics = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    for name in ("two-then-one", "one-then-two"):
        resumed = load_file(tmp_path / name / "final" / "model.safetensors")
        for weight in straight:
            assert (straight[weight] - resumed[weight]).abs().max() <= 1e-5, (name, weight)
        metrics = read_jsonl(tmp_path / name / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for a, b in zip(straight_metrics, metrics, strict=True):  # the same sequences, step by step
            assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], abs=1e-5), name

    # a checkpoint of two processes without the file of rank 2 is refused, naming what is missing
    broken = tmp_path / "broken"
    _run([*two, *_offline(tiny_model, rollouts, broken, 2, *extra)], env)
    state = broken / "checkpoints" / "step-000001" / "state"
    (state / "shard-00002-model-00001-of-00001.safetensors").unlink()
    config = TrainConfig.load(
        None,
        {
            "model": tiny_model,
            "output_dir": str(broken),
            "progress": False,
            "data": {"rollouts": [str(rollouts)]},
            "rollout": {"prompts_per_step": 4},
            "optim": {
                "steps": 3,
                "lr": 3e-3,
                "max_grad_norm": 1.0,
                "micro_batch_size": 3,
                "updates_per_batch": 2,
            },
            "checkpoint": {"every": 1, "keep": 5},
        },
    )
    with pytest.raises(InputError, match=rf"{state}: the shards hold \d+ of the \d+ values of model\."):
        train(config)


SHARD_PROBE = """
import json, os, sys, torch
from pathlib import Path
from genesys.train.checkpoint import load_shards, save_shards
from genesys.train.distributed import close_world, init_world
from genesys.train.parallel import device_mesh, full_tensor, shard_model

world = init_world()
torch.manual_seed(0)
# 7 rows: uneven over 2 and 3 ranks; 1 row: rank 2 of 2 (and 2, 3 of 3) hold none of it
model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 1))
model = shard_model(model, device_mesh(world, "fsdp2", torch.device("cpu")), "fp32")
names = [name for name, _ in model.named_parameters()]
if sys.argv[1] == "save":
    tensors = {name: parameter for name, parameter in model.named_parameters()}
    tensors["count"] = torch.tensor(3.0)  # the same on every rank: written once
    save_shards(Path(sys.argv[2]), tensors, world)
else:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    tensors = {name: parameter for name, parameter in model.named_parameters()}
    tensors["count"] = torch.tensor(0.0)
    load_shards(Path(sys.argv[2]).parent, tensors)
values = {name: full_tensor(parameter.detach()).tolist() for name, parameter in model.named_parameters()}
# one write of the whole line: the ranks share one pipe, and print's separate write of the newline
# let another rank's line start in the middle of this one
os.write(1, f"VALUES {world.rank} {json.dumps({**values, 'count': float(tensors['count'])})}\\n".encode())
close_world(world)
"""


def _probe(probe: Path, processes: int, *args: str, env: dict[str, str]) -> list[dict]:
    import json

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
    ]
    done = subprocess.run([*command, str(probe), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        json.loads(line.split(" ", 2)[2]) for line in done.stdout.splitlines() if line.startswith("VALUES")
    ]


def test_shards_of_two_processes_load_in_one_and_in_three_uneven_and_empty_shards_included(
    tmp_path, plugin_env
):
    probe = tmp_path / "probe.py"
    probe.write_text(SHARD_PROBE)
    env = {**plugin_env, "OMP_NUM_THREADS": "1"}
    shards = tmp_path / "checkpoint" / "state"
    (saved,) = {json_text(values) for values in _probe(probe, 2, "save", str(shards), env=env)}
    assert len(list(shards.glob("*.safetensors"))) == 2
    for processes in (1, 3):
        loaded = {json_text(values) for values in _probe(probe, processes, "load", str(shards), env=env)}
        assert loaded == {saved}, processes


def json_text(values: dict) -> str:
    import json

    return json.dumps(values, sort_keys=True)


def test_when_rank_0_cannot_read_the_model_every_rank_stops_with_the_reason(tiny_model, tmp_path, plugin_env):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "model.safetensors").unlink()  # config and tokenizer still there: every rank builds the model
    done = subprocess.run(
        [*TORCHRUN, "-m", "genesys.cli", *_offline(str(model), _recorded(tmp_path), tmp_path / "run", 2)],
        env={**plugin_env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,  # the other rank does not wait for weights that never come
    )
    assert done.returncode != 0
    assert done.stderr.count(f"model {str(model)!r} cannot be loaded") == 2, done.stderr[-3000:]


def test_only_rank_0_reads_the_pretrained_model_the_other_ranks_hold_their_shards():
    """Peak host memory of each of two processes loading a bf16 model (benchmarks/train_memory.py):
    rank 1 holds its half in fp32 and one tensor in flight, where reading the model itself held a
    whole fp32 copy beside its half; rank 0 the bf16 model it reads beside its half."""
    import re

    from conftest import REPO

    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/train_memory.py",
            "--table",
            "loading",
            "--loading-shapes",
            "layered",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| layered +\| +(\d+) \| +(\d) \| +(\d+) \| +(\d+) \|", done.stdout, re.M)
    peaks = {int(rank): (int(full), int(every), int(rank0)) for full, rank, every, rank0 in rows}
    assert peaks.keys() == {0, 1}, done.stdout
    full, every, rank0 = peaks[1]
    assert every >= full  # the baseline: a whole fp32 copy on every rank
    assert rank0 <= 0.8 * full, done.stdout  # half of it, and one tensor at a time
    full, every, rank0 = peaks[0]
    assert rank0 <= 1.35 * full, done.stdout  # the bf16 model read, beside its fp32 half


SHARDING_PROBE = """
import json, os, sys, torch
from genesys.train.distributed import close_world, init_world
from genesys.train.loading import sharded_pretrained
from genesys.train.parallel import clip_grad_norm, device_mesh, local_tensor

world = init_world()
report = {}
for strategy in ("fsdp2", "ddp"):
    cpu = torch.device("cpu")
    model = sharded_pretrained(sys.argv[1], world, device_mesh(world, strategy, cpu), "fp32", cpu)
    full = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.tensor([[1, 2, 3, 4 + world.rank]])).logits.float().mean().backward()
    norm = clip_grad_norm(model.parameters(), 1.0)
    optimizer.step()
    local = lambda tensors: sum(local_tensor(t).numel() for t in tensors)
    report[strategy] = {
        "full": full,
        "parameters": local(model.parameters()),
        "gradients": local(p.grad for p in model.parameters()),
        "optimizer": local(s["exp_avg"] for s in optimizer.state.values()),
        "norm": norm,
    }
os.write(1, f"REPORT {world.rank} {json.dumps(report)}\\n".encode())  # one write: the ranks share a pipe
close_world(world)
"""


def test_fsdp2_shards_parameters_gradients_and_optimizer_state_and_ddp_replicates_them(
    tiny_model, tmp_path, plugin_env
):
    import json

    probe = tmp_path / "probe.py"
    probe.write_text(SHARDING_PROBE)
    done = subprocess.run(
        [*TORCHRUN, str(probe), tiny_model],
        env={**plugin_env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [
        json.loads(line.split(" ", 2)[2]) for line in done.stdout.splitlines() if line.startswith("REPORT")
    ]
    assert len(reports) == 2
    for report in reports:
        sharded, replicated = report["fsdp2"], report["ddp"]
        for what in ("parameters", "gradients", "optimizer"):
            assert sharded[what] <= sharded["full"] // 2 + 4096, what  # about half on each of two ranks
            assert replicated[what] == replicated["full"], what
    assert sum(report["fsdp2"]["parameters"] for report in reports) >= reports[0]["fsdp2"]["full"]
    assert reports[0]["fsdp2"]["norm"] == reports[1]["fsdp2"]["norm"]  # one global norm on every rank


WORLDS_PROBE = """
import faulthandler, sys, torch, torch.distributed as dist
from genesys.train.distributed import close_world, init_world
from genesys.train.parallel import device_mesh
faulthandler.dump_traceback_later(120, exit=True)
seen = []
for generation in range(6):
    world = init_world()
    mesh = device_mesh(world, ("ddp", "fsdp2")[generation % 2], torch.device("cpu"))
    value = torch.tensor([float(world.rank + 1 + generation)])
    dist.all_reduce(value, group=mesh.get_group(mesh.mesh_dim_names[0]))
    seen.append(value.item())
    close_world(world)
    rank = world.rank
open(f"{sys.argv[1]}/rank-{rank}", "w").write(" ".join(map(str, seen)))
"""


def test_one_process_joins_torchrun_groups_one_after_another(tmp_path):
    """Two trainings in one torchrun process: each group made after the last was destroyed
    rendezvouses on keys of its own (torch names every world's groups alike, and on the keys an
    earlier group left a rank could join its peer's old group and hang there)."""
    script = tmp_path / "worlds.py"
    script.write_text(WORLDS_PROBE)
    done = subprocess.run(
        [*TORCHRUN, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # each world's all_reduce summed both ranks' values of that world
        sums = (tmp_path / f"rank-{rank}").read_text().split()
        assert sums == [str(float(3 + 2 * generation)) for generation in range(6)]
