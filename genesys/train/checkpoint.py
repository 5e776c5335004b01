"""Checkpoints: `checkpoints/step-NNNNNN/` holds

- `state/`: the training state of every rank, sharded as it trains: the fp32 weights it trains (all of
  them, or the LoRA adapters) and persistent buffers, and AdamW's moments, each rank writing the
  slices it holds (torch.distributed.checkpoint with its safetensors storage, files
  `shard-RRRRR-model-IIIII-of-NNNNN.safetensors` whose headers say where each slice lies in the whole
  tensor). No rank ever holds another rank's part, and a run resumes on any number of processes:
  each reads the slices of its own shards (DCP reshards);
- `trainer_state.json`, with its small tensors in `trainer_state.safetensors`: the step, the
  optimizer's hyperparameters by parameter name, the scheduler, and each rank's RNG states, data
  position and unfinished batch (`ranks`, gathered on rank 0: a few kilobytes each);
- the model as a Hugging Face folder (safetensors in the model's own dtype, LoRA merged;
  `genesys.train.export.write_model`), for evaluating or starting another run from; resuming does not
  read it.

Every rank writes into the same directory, so `output_dir` must be on storage every node sees. A
checkpoint is written into a temporary directory and renamed into place once every rank has written
its part and rank 0 the JSON, so a directory named `step-NNNNNN` is always complete; a run killed at
any moment resumes from the newest one. Nothing is ever unpickled: the state is plain JSON and
tensors (tuples, non-string keys, numpy arrays and non-finite floats are spelled out as tagged
objects), the shards and the model are safetensors. Checkpoints of an older genesys are refused with
what to do: one whose state is the pickle `trainer_state.pt`, and one whose state was gathered whole
on rank 0 (version 1 of the JSON, without `state/`). A model with a non-finite weight is never written.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genesys.errors import InputError, TrainingError
from genesys.train.distributed import World
from genesys.train.parallel import local_tensor

log = logging.getLogger(__name__)
STATE_FILE = "trainer_state.json"
TENSORS_FILE = "trainer_state.safetensors"
LEGACY_STATE_FILE = "trainer_state.pt"  # a pickle, written by genesys before the JSON state: never loaded
SHARDS_DIR = "state"
STATE_FORMAT = "genesys-trainer-state"
STATE_VERSION = 2  # 1: the state gathered whole on rank 0 (no `state/`), refused
SHARD_FILE_BYTES = 2 * 2**30  # about what one rank writes per file of its shards
TAG = "__genesys__"  # the key of a tagged object in the state's JSON
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under `root`, oldest first."""
    return [(step, path) for step, path in _step_dirs(root) if (path / STATE_FILE).is_file()]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint, or None; an InputError when the newest is one of an older
    genesys (its state a pickle), which is never loaded."""
    for _, path in reversed(_step_dirs(root)):
        if (path / STATE_FILE).is_file():
            return path
        if (path / LEGACY_STATE_FILE).is_file():
            raise InputError(
                f"{path} holds {LEGACY_STATE_FILE}, trainer state in the pickle format of an older genesys; "
                "genesys does not load pickles (unpickling a file runs whatever code it names). "
                + _older_checkpoint_advice(path)
            )
    return None


def _older_checkpoint_advice(path: Path) -> str:
    return (
        f"Its folder is a complete model: start a new run from its weights (--model {path} with another "
        "output_dir), without its optimizer state, or finish this run with the genesys that wrote it"
    )


def rng_states() -> dict[str, Any]:
    """Python's, numpy's and torch's random states (CPU and, when present, CUDA)."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def nonfinite_parameters(model: Any) -> list[str]:
    """The names of the model's parameters and buffers holding a NaN or an infinity (in this rank's
    shards, for a sharded model)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [
        name
        for name, tensor in named
        if tensor.is_floating_point() and not bool(torch.isfinite(local_tensor(tensor.detach())).all())
    ]


def check_finite(model: Any, what: str, world: World | None = None) -> None:
    """Refuse to write `what` when a weight of `model` is not finite (a TrainingError naming it). With
    `world`, every rank looks at its own shards and all of them refuse together."""
    bad = nonfinite_parameters(model)
    (anywhere,) = world.max([float(bool(bad))]) if world is not None else [float(bool(bad))]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise TrainingError(f"not writing {what}: weight {bad[0]}{more} holds NaN or infinite values")
    if anywhere:
        raise TrainingError(f"not writing {what}: a weight holds NaN or infinite values (on another rank)")


def save_checkpoint(
    root: Path,
    step: int,
    world: World,
    write_parts: Callable[[Path], None],
    state: Callable[[], dict[str, Any]],
    keep: int,
) -> Path:
    """Write checkpoint `step` atomically: every rank calls `write_parts(directory)` (the shards and
    the model folder, collectives), then rank 0 writes the trainer state `state()` and renames the
    directory into place, deleting all but the newest `keep`. Every rank must call it; returns the path."""
    final = step_dir(root, step)
    temporary = root / f".tmp-{final.name}"
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)  # left by a run killed while writing this step
        temporary.mkdir()
    world.barrier()
    write_parts(temporary)
    document = state()  # every rank: it may gather from the others
    world.barrier()  # every rank's files are written
    if world.is_main:
        write_state(temporary, document)
        _fsync_tree(temporary)
        if final.exists():  # a checkpoint of this step from a run that was resumed before it: replace it
            shutil.rmtree(final)
        os.replace(temporary, final)
        _fsync_dir(root)
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp-step-*"):  # left by a run killed while writing another step
            shutil.rmtree(stale, ignore_errors=True)
    world.barrier()
    return final


def save_shards(directory: Path, tensors: dict[str, torch.Tensor], world: World) -> None:
    """Every rank writes the slices it holds of `tensors` (DTensors, or tensors every rank holds
    whole: written once) into `directory` as safetensors, in files of about `SHARD_FILE_BYTES` per
    rank. Every rank must call it with the same names, in the same order."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    files: dict[str, int] = {}
    index, filled = 1, 0
    budget = SHARD_FILE_BYTES * world.size  # of whole tensors: each rank holds about 1/size of them
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if filled and filled + size > budget:
            index, filled = index + 1, 0
        files[name] = index
        filled += size
    writer = HuggingFaceStorageWriter(str(directory), fqn_to_index_mapping=files, save_distributed=True)
    dcp.save(tensors, storage_writer=writer)


def load_shards(checkpoint: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Read into `tensors` (DTensors of this rank's shards, or whole tensors) their values from
    checkpoint's `state/`, whatever the number of ranks that wrote it: each rank reads only the
    slices it holds. Every rank must call it. An InputError names a tensor the shards do not hold
    whole (a missing file) or whose shape differs."""
    import torch.distributed.checkpoint as dcp
    from safetensors import SafetensorError
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    directory = checkpoint / SHARDS_DIR
    if not directory.is_dir():
        raise InputError(f"{checkpoint}: no {SHARDS_DIR}/ with the sharded training state")
    reader = HuggingFaceStorageReader(str(directory))
    try:  # the headers of every file: where each slice lies
        stored = reader.read_metadata().state_dict_metadata
    except (OSError, ValueError, SafetensorError) as exc:
        raise InputError(f"{directory}: the shards cannot be read ({exc})") from None
    for name, tensor in tensors.items():
        held = stored.get(name)
        if held is None:
            raise InputError(
                f"{directory}: no {name} in its shards (a file of the checkpoint is missing, or other "
                "settings wrote it: resume with those)"
            )
        shape, stored_shape = tuple(tensor.shape), tuple(held.size)  # stored: as far as its slices reach
        if len(stored_shape) != len(shape) or any(have > want for have, want in zip(stored_shape, shape)):
            raise InputError(
                f"{directory}: {name} has shape {stored_shape}, the model's {shape}; "
                "resume with the model and settings that wrote it"
            )
        covered = sum(math.prod(chunk.sizes) for chunk in held.chunks)
        if covered != math.prod(shape):
            raise InputError(
                f"{directory}: the shards hold {covered} of the {math.prod(shape)} values of {name}: "
                "a file of the checkpoint is missing or cut short (or other settings wrote it)"
            )
    dcp.load(tensors, storage_reader=reader)


def write_state(checkpoint: Path, state: dict[str, Any]) -> None:
    """`state` as `trainer_state.json` and `trainer_state.safetensors` in `checkpoint`."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    document = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "state": _encode(state, tensors),
    }
    save_file(tensors, str(checkpoint / TENSORS_FILE))
    (checkpoint / STATE_FILE).write_text(json.dumps(document, allow_nan=False))


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint: JSON and safetensors only, nothing unpickled. A stray
    pickle beside it is ignored (and said so); an InputError names a state that cannot be read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for stray in sorted(checkpoint.glob("*.pt")) + sorted(checkpoint.glob("*.pkl")):
        log.warning("%s: ignored (a pickle; genesys never loads pickles)", stray)
    try:
        document = json.loads((checkpoint / STATE_FILE).read_text())
        tensors = load_file(str(checkpoint / TENSORS_FILE), device="cpu")
    except (OSError, ValueError, SafetensorError) as exc:
        raise InputError(f"{checkpoint}: the trainer state cannot be read ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
        raise InputError(f"{checkpoint / STATE_FILE}: not a genesys trainer state")
    if document.get("version") == 1:
        raise InputError(
            f"{checkpoint} is a checkpoint of an older genesys, its training state gathered whole on one "
            f"process (trainer state version 1, no {SHARDS_DIR}/); this genesys resumes from sharded "
            f"checkpoints (version {STATE_VERSION}). " + _older_checkpoint_advice(checkpoint)
        )
    if document.get("version") != STATE_VERSION:
        raise InputError(
            f"{checkpoint / STATE_FILE}: not a trainer state of version {STATE_VERSION} of this genesys"
        )
    try:
        return _decode(document["state"], tensors)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{checkpoint / STATE_FILE}: malformed trainer state ({exc})") from None


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` as JSON, its tensors (and numpy arrays, as bytes) moved into `tensors`."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {TAG: "float", "value": repr(value)}
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().to("cpu").contiguous()
        return {TAG: "tensor", "key": key}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"cannot store a numpy array of dtype {value.dtype} in the trainer state")
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.frombuffer(value.tobytes(), dtype=np.uint8).copy())
        return {TAG: "ndarray", "key": key, "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return _encode(value.item(), tensors)
    if isinstance(value, bytes):
        return {TAG: "bytes", "value": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {TAG: "tuple", "items": [_encode(item, tensors) for item in value]}
    if isinstance(value, list):
        return [_encode(item, tensors) for item in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and TAG not in value:
            return {key: _encode(item, tensors) for key, item in value.items()}
        return {TAG: "dict", "items": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    raise TypeError(f"cannot store a {type(value).__name__} in the trainer state")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if TAG not in value:
        return {key: _decode(item, tensors) for key, item in value.items()}
    kind = value[TAG]
    if kind == "tensor":
        return tensors[value["key"]]
    if kind == "ndarray":
        dtype = np.dtype(value["dtype"])
        if dtype.kind not in "biuf":
            raise ValueError(f"numpy dtype {dtype} is not a number type")
        data = tensors[value["key"]].numpy().tobytes()
        return np.frombuffer(data, dtype=dtype).reshape(value["shape"]).copy()
    if kind == "float":
        number = float(value["value"])
        if math.isfinite(number):
            raise ValueError(f"a tagged float must be nan or infinite, got {value['value']!r}")
        return number
    if kind == "bytes":
        return base64.b64decode(value["value"], validate=True)
    if kind == "tuple":
        return tuple(_decode(item, tensors) for item in value["items"])
    if kind == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["items"]}
    raise ValueError(f"unknown tagged value {kind!r}")


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
