"""The asynchronous loop: rollout keeps going while the trainer steps; staleness is bounded.

``run.mode = "async"``. Two coroutines share one event loop:

- the **rollouter** starts groups (``rollout.n_per_task`` trials of one task) whenever a
  trial slot is free, so ``rollout.concurrency`` trials are in flight at all times, and
  hands each group to the buffer once all its trials are recorded;
- the **trainer** takes ``rollout.tasks_per_step`` finished groups, runs
  ``optimizer.step`` in a thread (rollout goes on meanwhile), pushes the new weights with
  ``update_weights(mode="partial")`` (in-flight generations pause at a token boundary and
  continue under them), checkpoints, and writes the step's metrics line.

The loop talks to rollout only through ``TrialRunner.run_one`` (``slr.rollout.recorder``): the
in-process ``TrialRecorder``, or the pool of rollout workers (``[run] rollout_workers``,
``slr.cluster.workers``) that records through it.

**Staleness.** Step ``s`` updates weights version ``s - 1`` to ``s``; a token sampled by
version ``v`` and trained in step ``s`` is ``s - 1 - v`` versions old. Admission control
keeps that at most ``rollout.max_staleness`` (``k``) without throwing work away: a group
started now, at engine version ``v``, with ``ahead`` started-but-untrained groups before
it and the trainer about to fill step ``next``, is trained at step
``next + ahead // tasks_per_step`` at the latest if groups are trained in the order they
were started, so it is started only if ``next + ahead // tasks_per_step - 1 - v <= k``.
Groups finishing out of order can still overtake an older one past the bound: the trainer
prefers the oldest finished groups, and one that still exceeds ``k`` is dropped or kept per
``rollout.on_stale``. With ``k = 0`` nothing starts while a step trains, so every trained
token was sampled by the weights being updated: on-policy, like the synchronous loop.

**Dynamic sampling.** With ``rollout.dynamic_sampling``, a finished group whose trainable
rewards are all equal (no group-relative signal) is left out and another group starts in
its place, at most ``rollout.max_oversample`` per step; past that budget such groups fill
the batch (the optimizer leaves zero-variance groups out of the loss by default).

**Ids and resume.** Group ``g`` (a sequence number) is ``g000123-<task>``, its trials
``g000123-<task>-<k>``; its task is a pure function of ``(run.seed, g)``
(``task_of_group``). Each checkpoint records every group trained so far
(``LoopState.trained_groups``). ``--resume`` reloads the checkpoint, moves trials whose
weights no longer exist (sampled by a version past the checkpoint) to ``trials/discarded/``,
puts finished groups that were not trained back in the buffer (their staleness is judged
as any other's), re-runs the missing trials of half-finished groups and starts the groups
that were in flight with nothing recorded. So nothing is lost beyond the trials in flight,
and no group is trained twice by the weights that survive.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import structlog

from slr import log as slr_log
from slr.contracts import TerminationReason, TrialResult
from slr.errors import UsageError
from slr.hookspecs import RunStatus
from slr.rollout.recorder import TrialRunner, TrialSpec
from slr.run import checkpoints
from slr.run.loop import Loop, no_signal, oversampled
from slr.tasks import Task

log = structlog.get_logger()

_GROUP = re.compile(r"g(\d{6,})-(.+)")


def async_group_id(seq: int, task: Task) -> str:
    """Group ``seq`` of an async run: ``g000123-hello-world``."""
    return f"g{seq:06d}-{task.id}"


def async_trial_id(seq: int, task: Task, k: int) -> str:
    """Sample ``k`` of that group: ``g000123-hello-world-0``."""
    return f"{async_group_id(seq, task)}-{k}"


def group_seq(group_id: str | None) -> int | None:
    """The sequence number of an async group id, or None for any other id."""
    found = _GROUP.fullmatch(group_id or "")
    return None if found is None else int(found.group(1))


def task_of_group(tasks: Sequence[Task], *, seed: int, seq: int) -> Task:
    """The task of group ``seq``: a pure function of (seed, seq). Every block of
    ``len(tasks)`` consecutive groups is one shuffled pass over the tasks."""
    block, offset = divmod(seq, len(tasks))
    order = list(tasks)
    random.Random(f"{seed}:groups:{block}").shuffle(order)
    return order[offset]


def group_specs(tasks: Sequence[Task], *, seed: int, seq: int, n: int) -> list[TrialSpec]:
    task = task_of_group(tasks, seed=seed, seq=seq)
    gid = async_group_id(seq, task)
    return [
        TrialSpec(task=task, trial_id=async_trial_id(seq, task, k), group_id=gid) for k in range(n)
    ]


def token_versions(trial: TrialResult) -> list[int]:
    """The weight version of each policy token; a trial without per-token versions counts
    each of its policy tokens (or, with none, itself once) at its start version."""
    out: list[int] = []
    segments = trial.trajectory.segments if trial.trajectory is not None else ()
    for seg in segments:
        versions = seg.weights_versions or (trial.weights_version or 0,) * len(seg.token_ids)
        out.extend(v for v, m in zip(versions, seg.loss_mask, strict=False) if m)
    if not out and trial.weights_version is not None:
        out.append(trial.weights_version)
    return out


@attrs.define
class Group:
    seq: int
    specs: list[TrialSpec]
    version: int
    """The engine's weights version when the group started (a lower bound of its tokens')."""
    trials: list[TrialResult] = attrs.field(factory=list)

    @property
    def id(self) -> str:
        return self.specs[0].group_id or ""

    def oldest_version(self) -> int:
        found = [v for t in self.trials for v in token_versions(t)]
        return min(found) if found else self.version


@attrs.define
class StepWindow:
    """What happened between two trainer steps, for the step's metrics line."""

    started: int = 0
    dropped_stale: int = 0
    kept_stale: int = 0
    dropped_no_signal: int = 0
    oversampled: int = 0
    """Set when the step's batch is taken: the groups started in place of those dropped on
    the step's budget (``slr.run.loop.oversampled``). Not ``dropped_no_signal``: a group
    dropped while the step trains counts in this window but on the next step's budget."""
    admission_wait_s: float = 0.0

    def groups_metrics(self, *, trained: int) -> dict[str, int]:
        """The step's ``groups/*`` metrics; ``trained``: the groups in its batch."""
        return {
            "groups/started": self.started,
            "groups/trained": trained,
            "groups/dropped_stale": self.dropped_stale,
            "groups/kept_stale": self.kept_stale,
            "groups/dropped_no_signal": self.dropped_no_signal,
            "groups/oversampled": self.oversampled,
        }


class AsyncLoop(Loop):
    """``run.mode = "async"``; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trained: set[str] = set()
        self._recovered: list[Group] = []
        self._cond = asyncio.Condition()
        self.version = 0  # the weights version the engine serves
        self.steps_taken = 0  # steps whose batch the trainer has taken
        self.ahead = 0  # groups started (or recovered) and neither trained nor dropped
        self.pending_trials = 0  # trials of started groups not yet recorded
        self.buffer: list[Group] = []
        self.window = StepWindow()
        self._oversampled = 0  # groups replaced by dynamic sampling for the step being filled
        self._done = False
        self._groups: set[asyncio.Task[None]] = set()
        self._runner: TrialRunner | None = None

    # -- resume -------------------------------------------------------------------------

    def _restore_state(self, state: checkpoints.LoopState) -> None:
        self.trained = set(state.trained_groups)

    def _discard_after(self, done: int) -> None:
        mine = [t for t in self.run.trials() if group_seq(t.group_id) is not None]
        gone = [t for t in mine if max(token_versions(t), default=0) > done]
        self._discard_trials(gone, after_step=done + 1)
        self._drop_metrics_after(done)
        lost = {t.trial_id for t in gone}
        groups: dict[str, list[TrialResult]] = {}
        for t in mine:
            # a trial lost with its rollout worker ran again under another id
            # (slr.cluster.workers): its retry stands for it in the group
            if t.termination is TerminationReason.WORKER_LOST:
                continue
            if t.trial_id not in lost and t.group_id not in self.trained:
                groups.setdefault(t.group_id or "", []).append(t)
        n = self.config.rollout.n_per_task
        for gid, trials in sorted(groups.items()):
            if len(trials) == n:
                seq = group_seq(gid)
                assert seq is not None
                specs = self._specs(seq)
                start = min(t.weights_version or 0 for t in trials)
                self._recovered.append(Group(seq=seq, specs=specs, version=start, trials=trials))

    # -- the rollouter --------------------------------------------------------------------

    def _specs(self, seq: int) -> list[TrialSpec]:
        return group_specs(
            self.tasks, seed=self.config.run.seed, seq=seq, n=self.config.rollout.n_per_task
        )

    def _sequence(self) -> Iterator[int]:
        """Group numbers to start: every one not trained and not already finished, in order."""
        skip = self.trained | {g.id for g in self._recovered}
        seq = 0
        while True:
            if self._specs(seq)[0].group_id not in skip:
                yield seq
            seq += 1

    def _slot_free(self) -> bool:
        return self._done or self.pending_trials < self.config.rollout.concurrency

    def _admissible(self) -> bool:
        """Whether a group started now stays within max_staleness if trained in order."""
        if self._done:
            return True
        r = self.config.rollout
        remaining = self.config.run.steps - self.steps_taken
        if self.ahead >= remaining * r.tasks_per_step:
            return False  # enough groups for the rest of the run are under way
        trained_at = self.steps_taken + 1 + self.ahead // r.tasks_per_step
        return trained_at - 1 - self.version <= r.max_staleness

    def _lookahead(self) -> int:
        """How many groups to announce before they start: enough to fill the warm pool."""
        r = self.config.rollout
        return max(1, -(-r.pool_size // r.n_per_task))

    async def _rollouter(self, runner: TrialRunner, tg: asyncio.TaskGroup) -> None:
        n = self.config.rollout.n_per_task
        sem = asyncio.Semaphore(self.config.rollout.concurrency)
        upcoming: collections.deque[int] = collections.deque()
        sequence = self._sequence()
        while True:
            # announce the next groups before waiting for a slot, so a warm pool has their
            # sandboxes started by the time they run
            while len(upcoming) < self._lookahead():
                upcoming.append(seq := next(sequence))
                runner.expect(self._specs(seq))
            seq = upcoming.popleft()
            async with self._cond:
                await self._cond.wait_for(self._slot_free)
                t0 = time.monotonic()
                await self._cond.wait_for(self._admissible)
                self.window.admission_wait_s += time.monotonic() - t0
                if self._done:
                    return
                group = Group(seq=seq, specs=self._specs(seq), version=self.version)
                self.ahead += 1
                self.pending_trials += n
                self.window.started += 1
            task = tg.create_task(self._run_group(group, runner, sem))
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    async def _run_group(self, group: Group, runner: TrialRunner, sem: asyncio.Semaphore) -> None:
        async def one(spec: TrialSpec) -> TrialResult:
            try:
                async with sem:
                    trial = await runner.run_one(spec)
                self.versions.check([trial])
                return trial
            finally:
                async with self._cond:
                    self.pending_trials -= 1
                    self._cond.notify_all()

        with slr_log.bound(group_id=group.id):
            group.trials = list(await asyncio.gather(*(one(s) for s in group.specs)))
        async with self._cond:
            self._finished(group)
            self._cond.notify_all()

    def _finished(self, group: Group) -> None:
        r = self.config.rollout
        if r.dynamic_sampling and self._oversampled < r.max_oversample and no_signal(group.trials):
            self._oversampled += 1
            self.window.dropped_no_signal += 1
            self.ahead -= 1  # its place goes to a new group
            log.info("group dropped: no reward variance", group_id=group.id)
            return
        self.buffer.append(group)

    # -- the trainer ----------------------------------------------------------------------

    async def _take_batch(self, step: int) -> list[Group]:
        """``tasks_per_step`` finished groups for step ``step``, oldest first."""
        r = self.config.rollout
        batch: list[Group] = []
        async with self._cond:
            while len(batch) < r.tasks_per_step:
                await self._cond.wait_for(lambda: bool(self.buffer))
                self.buffer.sort(key=lambda g: (g.oldest_version(), g.seq))
                group = self.buffer.pop(0)
                if step - 1 - group.oldest_version() > r.max_staleness:
                    if r.on_stale == "drop":
                        self.window.dropped_stale += 1
                        self.ahead -= 1
                        self._cond.notify_all()
                        log.info("group dropped: too stale", group_id=group.id, step=step)
                        continue
                    self.window.kept_stale += 1
                batch.append(group)
            self.steps_taken = step
            self.ahead -= len(batch)
            self.window.oversampled = oversampled(
                self.config, rolled_out=len(batch) + self._oversampled
            )
            self._oversampled = 0
            self._cond.notify_all()
        return batch

    async def _train_step(self, step: int) -> dict[str, Any]:
        t0 = time.monotonic()
        batch = await self._take_batch(step)
        t1 = time.monotonic()
        trials = [t for g in batch for t in g.trials]
        ages = [step - 1 - v for t in trials for v in token_versions(t)]
        metrics: dict[str, Any] = dict(await asyncio.to_thread(self.parts.optimizer.step, trials))
        t2 = time.monotonic()
        in_flight = self.pending_trials
        try:
            weights, version = await self.publish(step, mode="partial")
        except NotImplementedError as exc:
            raise UsageError(
                f"run.mode = 'async' needs an engine that can update weights mid-generation "
                f"(update_weights mode='partial'), and this one cannot: {exc}. Use "
                f"run.mode = 'sync' with this engine."
            ) from exc
        t3 = time.monotonic()
        async with self._cond:
            self.version = version
            window, self.window = self.window, StepWindow()
            self._cond.notify_all()
        self.trained.update(g.id for g in batch)
        metrics.update(
            self.step_metrics(trials, weights, version, self._runner),
            **{
                "staleness/age_min": min(ages, default=0),
                "staleness/age_max": max(ages, default=0),
                "staleness/age_mean": sum(ages) / len(ages) if ages else 0.0,
                **window.groups_metrics(trained=len(batch)),
                "trials/in_flight_at_update": in_flight,
                "time/trainer_wait_s": t1 - t0,
                "time/admission_wait_s": window.admission_wait_s,
                "time/update_s": t2 - t1,
                "time/sync_s": t3 - t2,
            },
        )
        await self.checkpoint(step, metrics, trained_groups=sorted(self.trained))
        metrics["time/step_s"] = time.monotonic() - t0
        return metrics

    # -- the run ----------------------------------------------------------------------------

    async def main(self) -> RunStatus:
        cfg = self.config
        async with self.recorder() as recorder, self.runner(recorder) as runner:
            self._runner = runner
            self.announce_placement(runner)
            await self.resume_weights()
            self.version = self.steps_taken = self.start_step - 1
            self.buffer = list(self._recovered)
            self.ahead = len(self.buffer)
            try:
                async with asyncio.TaskGroup() as tg:
                    rollouter = tg.create_task(self._rollouter(runner, tg))
                    for step in range(self.start_step, cfg.run.steps + 1):
                        with slr_log.bound(step=step):
                            metrics = await self._train_step(step)
                        await self.finish_step(step, metrics)
                    # the run is done: what is still in flight is cancelled, not recorded
                    async with self._cond:
                        self._done = True
                        self._cond.notify_all()
                    for task in (rollouter, *self._groups):
                        task.cancel()
            except BaseExceptionGroup as group:
                # one failure, not a group of them, for the caller (the first is the cause)
                raise group.exceptions[0] from None
        return "completed"
