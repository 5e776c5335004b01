"""Checkpoints: `checkpoints/step-NNNNNN/` holds a `save_pretrained` model and tokenizer
(safetensors) and `trainer_state.pt` (optimizer, scheduler, RNG states, data position, step).

A checkpoint is written into a temporary directory and renamed into place, so a directory named
`step-NNNNNN` is always complete; a run killed at any moment resumes from the newest one.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


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


def save_checkpoint(
    root: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep: int
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep`; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    temporary = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    save_pretrained(model, tokenizer, temporary)
    torch.save(state, temporary / STATE_FILE)
    _fsync_tree(temporary)
    if final.exists():  # a checkpoint of this step from a run that was resumed before it: replace it
        shutil.rmtree(final)
    os.replace(temporary, final)
    _fsync_dir(root)
    for _, old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # left by a run killed while writing
        if stale != temporary:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def save_pretrained(model: Any, tokenizer: Any, path: Path) -> None:
    """The model (safetensors) and tokenizer in the Hugging Face layout transformers and vLLM load."""
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (trusted: written by this trainer)."""
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


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
