"""The checkpoint layout of a run: the one module that reads and writes it.

::

    runs/<run-id>/checkpoints/
      step-000012/          one folder per checkpointed step (``checkpoint_dir``)
        ...                 whatever the optimizer's ``save`` writes
        loop.json           the loop's state: step, the step's metrics, servable weights,
                            the groups trained so far (async loop)
        COMPLETE            written last, after every other file is fsynced
      step-000013.partial/  a checkpoint being written (renamed into place when done)

A checkpoint counts only once its ``COMPLETE`` marker exists: a process killed while
writing one leaves a ``.partial`` folder (or a folder without the marker) that every reader
here ignores, so the previous complete checkpoint is the one resumed from or evaluated.
Optimizers write their own files into the folder they are given and never the marker;
``write_checkpoint`` is the only writer of the marker and of ``loop.json``.

``loop.json`` also records where the optimizer put weights an engine can serve
(``Optimizer.servable_weights``), so ``slr eval --checkpoint`` finds them without knowing
which optimizer wrote the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from slr.errors import UsageError
from slr.run.directory import RunDir, atomic_write

COMPLETE = "COMPLETE"
"""The marker file that makes a checkpoint folder count; written last."""
STATE = "loop.json"
"""The loop's state inside a checkpoint: ``step``, ``metrics``, ``servable_weights``."""
PARTIAL_SUFFIX = ".partial"
"""A checkpoint folder being written carries this suffix until it is complete."""
_STEP = re.compile(r"step-(\d{6,})")

_WHAT_TO_PASS = (
    "pass a checkpoint folder (RUN/checkpoints/step-NNNNNN) or a run directory (RUN, "
    "meaning its latest complete checkpoint)"
)


def checkpoint_dir(run: Path | RunDir, step: int) -> Path:
    """The folder of step ``step``'s checkpoint in ``run`` (a run directory or its path)."""
    return _run_path(run) / "checkpoints" / f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    return (Path(path) / COMPLETE).is_file()


def latest_checkpoint(run: Path | RunDir) -> Path | None:
    """The newest complete checkpoint of ``run``, or None."""
    folder = _run_path(run) / "checkpoints"
    done = sorted(p for p in folder.glob("step-*") if _STEP.fullmatch(p.name) and is_complete(p))
    return done[-1] if done else None


def require_complete(path: Path) -> None:
    """Refuse a checkpoint folder without its marker (for optimizers' ``load``)."""
    if not is_complete(path):
        raise UsageError(
            f"checkpoint {str(path)!r} is incomplete (no {COMPLETE} marker): the process "
            f"writing it was stopped. Resume from the previous checkpoint instead."
        )


@attrs.frozen(kw_only=True)
class LoopState:
    """What the loop stores beside the optimizer's files (``loop.json``)."""

    step: int
    metrics: Mapping[str, Any] = attrs.field(factory=dict)
    servable_weights: str | None = None
    """The served model folder, relative to the checkpoint folder; None if there is none."""
    trained_groups: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Every group id trained on up to this checkpoint (the async loop: nothing is trained
    twice after a resume); empty for the synchronous loop, whose steps say it."""


def write_checkpoint(
    run: Path | RunDir,
    step: int,
    *,
    save: Callable[[Path], None],
    metrics: Mapping[str, Any],
    servable_weights: Callable[[Path], Path | None] | None = None,
    trained_groups: Sequence[str] = (),
) -> Path:
    """Write step ``step``'s checkpoint: ``save(folder)`` fills it, then the state and marker.

    The folder is written under its ``.partial`` name and renamed into place once every file
    is on disk; ``COMPLETE`` is written after the rename, so a kill at any point leaves
    either no new checkpoint or a complete one.
    """
    path = checkpoint_dir(run, step)
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(tmp)
    servable = servable_weights(tmp) if servable_weights is not None else None
    state: dict[str, Any] = {
        "step": step,
        "metrics": dict(metrics),
        "servable_weights": None if servable is None else str(Path(servable).relative_to(tmp)),
    }
    if trained_groups:
        state["trained_groups"] = list(trained_groups)
    # The step's metrics travel with the checkpoint: a kill between the checkpoint and the
    # metrics line loses neither (resume writes the line back).
    atomic_write(tmp / STATE, json.dumps(state, sort_keys=True, default=str))
    _fsync_tree(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    atomic_write(path / COMPLETE, f"step {step}\n")
    return path


def read_state(path: Path) -> LoopState:
    """The loop state of a checkpoint folder (its step from the folder name if unreadable)."""
    try:
        raw = json.loads((Path(path) / STATE).read_text())
        return LoopState(
            step=int(raw["step"]),
            metrics=raw.get("metrics", {}),
            servable_weights=raw.get("servable_weights"),
            trained_groups=raw.get("trained_groups", ()),
        )
    except (OSError, ValueError, KeyError):
        found = _STEP.fullmatch(Path(path).name)
        if found is None:
            raise
        return LoopState(step=int(found.group(1)))


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A complete training checkpoint and the model folder an engine can serve."""

    path: Path
    weights: Path
    step: int | None
    run: Path | None


def resolve_checkpoint(path: Path | str) -> Checkpoint:
    """The checkpoint ``path`` names: a checkpoint folder, or a run's latest complete one."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"--checkpoint {str(path)!r} is not a folder; {_WHAT_TO_PASS}")
    run: Path | None = None
    if (path / RunDir.CONFIG).is_file():
        run = path
        latest = latest_checkpoint(path)
        if latest is None:
            raise UsageError(
                f"run {str(path)!r} has no complete checkpoint yet (no checkpoints/step-*/"
                f"{COMPLETE}); wait for its first checkpoint (run.checkpoint_every) or "
                f"evaluate the base model without --checkpoint"
            )
        path = latest
    elif (path.parent.parent / RunDir.CONFIG).is_file():
        run = path.parent.parent
    if not is_complete(path):
        hint = ""
        if run is not None and (latest := latest_checkpoint(run)) is not None:
            hint = f" The run's latest complete checkpoint is {str(latest)!r}."
        raise UsageError(
            f"{str(path)!r} is not a complete checkpoint (no {COMPLETE} marker: it is being "
            f"written, was interrupted, or is not a checkpoint at all); {_WHAT_TO_PASS}.{hint}"
        )
    try:
        state: LoopState | None = read_state(path)
    except (OSError, ValueError, KeyError):
        state = None
    weights = None if state is None or not state.servable_weights else path / state.servable_weights
    if state is None or weights is None or not weights.is_dir():
        raise UsageError(
            f"checkpoint {str(path)!r} names no servable weights (its {STATE} has no "
            f"servable_weights folder that exists), so there are no weights an engine can "
            f"serve: its optimizer does not export a model folder. Evaluate a checkpoint of "
            f"an optimizer that does (torch), or pass the model folder as "
            f"--set engine.model=PATH"
        )
    return Checkpoint(path=path, weights=weights, step=state.step, run=run)


def _run_path(run: Path | RunDir) -> Path:
    return run.path if isinstance(run, RunDir) else Path(run)


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
