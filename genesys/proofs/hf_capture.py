"""The final hidden states of a transformers causal LM, recorded with a forward hook on its base model.

The base model (`model.base_model`: the decoder stack and its final norm) returns the hidden states
the output layer reads. During `generate` it runs once per new token, on the whole prompt first and
then on one position at a time; the last position of each run is the state that produced the next
token. One prefill over prompt + completion gives the same states at once.
"""

from __future__ import annotations

from typing import Any

import torch


class FinalHiddenStates:
    """Records the base model's output at every forward while active (a context manager).

    `last_only` keeps only the last position of each forward (generation); otherwise the whole
    (batch, positions, hidden) output of each forward is kept (a prefill).
    """

    def __init__(self, model: Any, last_only: bool) -> None:
        self.base = model.base_model
        self.last_only = last_only
        self.outputs: list[torch.Tensor] = []
        self._handle: Any = None

    def __enter__(self) -> FinalHiddenStates:
        self._handle = self.base.register_forward_hook(self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _record(self, module: Any, args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        self.outputs.append(hidden[:, -1, :].clone() if self.last_only else hidden)

    def per_step(self) -> torch.Tensor:
        """Generation: the (batch, steps, hidden) states, step t being the one that produced new token t."""
        return torch.stack(self.outputs, dim=1)

    def prefill(self) -> torch.Tensor:
        """A prefill: the (batch, positions, hidden) states of its one forward."""
        if len(self.outputs) != 1:
            raise RuntimeError(f"expected one forward of the base model, saw {len(self.outputs)}")
        return self.outputs[0]
