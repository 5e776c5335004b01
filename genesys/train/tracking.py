"""Step metrics to experiment trackers, chosen by the trainer's `report_to`: tensorboard, wandb, trackio.

A tracker's library is imported only when `report_to` names it, and one that is not installed is
refused when the trackers are opened, before any training. TensorBoard event files go to
`output_dir/tensorboard`. wandb and trackio log to the project `$GENESYS_PROJECT` (default
"genesys"); wandb takes the rest of its settings from its own environment variables as usual
(`WANDB_MODE=offline` or `disabled`, `WANDB_ENTITY`, `WANDB_API_KEY`). A wandb run's id is kept in
`output_dir/tracker_runs.json`, and a resumed training run logs on into the same wandb run.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from genesys.errors import InputError
from genesys.train.metrics import is_metric_value

PROJECT_ENV = "GENESYS_PROJECT"
DEFAULT_PROJECT = "genesys"
TENSORBOARD_DIR = "tensorboard"
RUNS_FILE = "tracker_runs.json"  # tracker name -> the id of its run, for resuming


class _Backend(Protocol):
    def log(self, values: dict[str, float | int], step: int) -> None: ...

    def close(self) -> None: ...


class Tracker:
    """Sends each step's metrics to every opened tracker; `close` finishes them all."""

    def __init__(self, backends: Sequence[_Backend]) -> None:
        self._backends = list(backends)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log the numeric metrics at `step`; None and non-numeric values, and `step` itself, are skipped."""
        values = {key: value for key, value in metrics.items() if key != "step" and is_metric_value(value)}
        for backend in self._backends:
            backend.log(values, step)

    def close(self) -> None:
        """Finish every tracker (flushing what they hold); later calls do nothing."""
        for backend in self._backends:
            backend.close()
        self._backends = []


def open_trackers(
    report_to: Sequence[str],
    output_dir: Path,
    config: dict[str, Any],
    run_name: str,
    resume: bool = False,
) -> Tracker:
    """Open the trackers `report_to` names; an InputError names one that is unknown or not installed.
    With `resume`, a tracker that keeps runs by id (wandb) continues the run it opened before in
    `output_dir`."""
    modules = {name: _import(name) for name in dict.fromkeys(report_to)}
    backends: list[_Backend] = []
    try:
        for name, module in modules.items():
            backends.append(_TRACKERS[name][1](module, Path(output_dir), config, run_name, resume))
    except BaseException:
        Tracker(backends).close()
        raise
    return Tracker(backends)


def project_name() -> str:
    """The tracker project: `$GENESYS_PROJECT`, else "genesys"."""
    return os.environ.get(PROJECT_ENV) or DEFAULT_PROJECT


def _import(name: str) -> ModuleType:
    if name not in _TRACKERS:
        raise InputError(f"report_to: unknown tracker {name!r}; the trackers are {', '.join(_TRACKERS)}")
    try:
        return importlib.import_module(_TRACKERS[name][0])
    except ImportError as exc:
        raise InputError(
            f"report_to {name!r} needs the {name} package, which cannot be imported ({exc}): pip install {name}"
        ) from None


class _TensorBoard:
    """Scalars (and the config, as text) in event files under `output_dir/tensorboard`."""

    def __init__(
        self, module: ModuleType, output_dir: Path, config: dict[str, Any], run_name: str, resume: bool
    ) -> None:
        self.writer = module.SummaryWriter(log_dir=str(output_dir / TENSORBOARD_DIR))
        self.writer.add_text(
            "config", "    " + json.dumps(config, indent=2, default=str).replace("\n", "\n    ")
        )

    def log(self, values: dict[str, float | int], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    """A wandb run named `run_name`, its files under `output_dir/wandb`; resumed by its saved id."""

    def __init__(
        self, module: ModuleType, output_dir: Path, config: dict[str, Any], run_name: str, resume: bool
    ) -> None:
        saved = saved_run_id(output_dir, "wandb") if resume else None
        resuming = {"id": saved, "resume": "allow"} if saved else {}
        self.run = module.init(
            project=project_name(), name=run_name, config=config, dir=str(output_dir), **resuming
        )
        run_id = getattr(self.run, "id", None)
        if run_id:
            save_run_id(output_dir, "wandb", str(run_id))

    def log(self, values: dict[str, float | int], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    """A trackio run named `run_name`."""

    def __init__(
        self, module: ModuleType, output_dir: Path, config: dict[str, Any], run_name: str, resume: bool
    ) -> None:
        self.module = module
        module.init(project=project_name(), name=run_name, config=config)

    def log(self, values: dict[str, float | int], step: int) -> None:
        self.module.log(values, step=step)

    def close(self) -> None:
        self.module.finish()


def saved_run_id(output_dir: Path, tracker: str) -> str | None:
    """The id of `tracker`'s run that `output_dir` recorded, if any."""
    try:
        return json.loads((Path(output_dir) / RUNS_FILE).read_text()).get(tracker)
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return None


def save_run_id(output_dir: Path, tracker: str, run_id: str) -> None:
    """Record the id of `tracker`'s run in `output_dir`, atomically."""
    path = Path(output_dir) / RUNS_FILE
    try:
        runs = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        runs = {}
    runs = {**(runs if isinstance(runs, dict) else {}), tracker: run_id}
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(runs))
    os.replace(temporary, path)


# report_to value -> the module it imports (from the pip package of the same name) and its backend.
_TRACKERS: dict[str, tuple[str, type[_TensorBoard | _Wandb | _Trackio]]] = {
    "tensorboard": ("torch.utils.tensorboard", _TensorBoard),
    "wandb": ("wandb", _Wandb),
    "trackio": ("trackio", _Trackio),
}
