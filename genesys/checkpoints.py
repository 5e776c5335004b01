"""A transformers checkpoint read tensor by tensor, so no process needs the whole model in memory.

`Checkpoint` finds a model's safetensors files (one `model.safetensors`, or the shards that
`model.safetensors.index.json` names), knows which file holds each tensor, and reads one tensor at a
time with safetensors' `safe_open(...).get_tensor(name)`, which maps that tensor's bytes and no
others. A pipeline stage materialises its own layers this way (`genesys.inference.shard`), and the
weights hash of the proofs streams the whole checkpoint through it (`genesys.proofs.weights`).
Pickled `pytorch_model.bin` checkpoints are refused: reading them means unpickling them.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from genesys.errors import InputError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _locate(model: str, filename: str) -> str | None:
    """The local path of `filename` in model directory (or hub cache entry) `model`; None when absent."""
    local = Path(model) / filename
    if local.is_file():
        return str(local)
    if Path(model).is_dir():
        return None
    from transformers.utils import cached_file

    try:
        return cached_file(model, filename, _raise_exceptions_for_missing_entries=False)
    except OSError:
        return None


class Checkpoint:
    """The tensors of `model`'s safetensors checkpoint by name; use as a context manager (it keeps
    each file it reads from open until the block ends)."""

    def __init__(self, model: str) -> None:
        self.model = model
        index = _locate(model, INDEX_FILE)
        if index is not None:
            weight_map = json.loads(Path(index).read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise InputError(f"--model {model!r}: {INDEX_FILE} has no weight_map")
            self._files = {name: str(Path(index).parent / shard) for name, shard in weight_map.items()}
        else:
            single = _locate(model, WEIGHTS_FILE)
            if single is None:
                raise InputError(
                    f"--model {model!r}: no {WEIGHTS_FILE} or {INDEX_FILE} found; a model split into "
                    "stages is read tensor by tensor from safetensors files (convert a pytorch_model.bin "
                    "checkpoint with `save_pretrained(..., safe_serialization=True)`)"
                )
            from safetensors import safe_open

            with safe_open(single, framework="pt") as handle:
                self._files = dict.fromkeys(handle.keys(), single)
        self._stack = ExitStack()
        self._handles: dict[str, Any] = {}
        self.read_names: list[str] = []  # every tensor read so far, in order

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    @property
    def names(self) -> list[str]:
        return list(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name`, read from its file alone (on the CPU, in the checkpoint's dtype)."""
        path = self._files.get(name)
        if path is None:
            raise InputError(f"--model {self.model!r}: the checkpoint has no tensor {name!r}")
        handle = self._handles.get(path)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = self._stack.enter_context(safe_open(path, framework="pt"))
            except OSError as exc:
                raise InputError(f"--model {self.model!r}: cannot read {path}: {exc}") from None
            self._handles[path] = handle
        self.read_names.append(name)
        return handle.get_tensor(name)

    def floating_dtype(self) -> torch.dtype:
        """The dtype of the checkpoint's first floating-point tensor (float32 when it has none)."""
        from safetensors import safe_open

        for path in dict.fromkeys(self._files.values()):
            with safe_open(path, framework="pt") as handle:
                for name in handle.keys():
                    dtype = handle.get_slice(name).get_dtype()
                    if dtype in ("F16", "BF16", "F32", "F64"):
                        return {"F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}.get(
                            dtype, torch.float32
                        )
        return torch.float32


def weights_dtype(model: str, config: Any, dtype: str) -> torch.dtype:
    """The torch dtype `dtype` names; "auto" is what `from_pretrained(dtype="auto")` gives: the config's
    `dtype`, else that of the checkpoint's tensors."""
    if dtype != "auto":
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise InputError(f"--backend_options.dtype {dtype!r} is not a torch dtype")
        return resolved
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(declared, str):
        declared = getattr(torch, declared, None)
    if isinstance(declared, torch.dtype):
        return declared
    with Checkpoint(model) as checkpoint:
        return checkpoint.floating_dtype()


def meta_model(config: Any, dtype: torch.dtype) -> Any:
    """The causal LM `config` describes, on the meta device: its names, shapes and tied weights, no storage."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def tied_names(model: Any) -> dict[int, list[str]]:
    """Every name of each parameter of `model` (tied weights have several), by the parameter's id."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return names
