"""The weights versions a run's trainer published, and the tokens that claim any other.

Every token an engine samples carries the version of the weights that sampled it
(``Segment.weights_versions``); the loop trusts those versions for staleness and for which
weights a step trained on. A version the trainer never published means an engine served
weights nobody sent it (a replica that came back on its model folder, an engine that
numbers updates its own way): counted per step (``weights/unpublished_tokens``) and
logged, never silent. It does not stop the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import structlog

from slr.contracts import TrialResult

log = structlog.get_logger()

#: The step metric: policy tokens, in the trials the step saw, whose version was never published.
METRIC = "weights/unpublished_tokens"


class PublishedVersions:
    """The versions the engine was given by this run (its starting weights included), and a
    count of policy tokens since the last step's metrics that report another one."""

    def __init__(self, initial: Iterable[int]) -> None:
        self._known: set[int] = {int(v) for v in initial}
        self._unpublished = 0

    def add(self, *versions: int) -> None:
        self._known.update(int(v) for v in versions)

    def check(self, trials: Sequence[TrialResult]) -> int:
        """Count (and log, per trial) the policy tokens whose version was never published;
        returns how many there were in ``trials``."""
        found = 0
        for trial in trials:
            bad: dict[int, int] = {}
            for seg in trial.trajectory.segments if trial.trajectory is not None else ():
                for version, mask in zip(seg.weights_versions, seg.loss_mask, strict=False):
                    if mask and version not in self._known:
                        bad[version] = bad.get(version, 0) + 1
            if bad:
                log.warning(
                    "tokens report a weights version the trainer never published",
                    trial_id=trial.trial_id,
                    versions=dict(sorted(bad.items())),
                    published=sorted(self._known),
                )
                found += sum(bad.values())
        self._unpublished += found
        return found

    def take(self) -> dict[str, int]:
        """The step metric, counted since the previous call."""
        count, self._unpublished = self._unpublished, 0
        return {METRIC: count}
