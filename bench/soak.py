"""Faults under load: a real ``slr run`` while a seeded injector kills its parts at random.

    .venv/bin/python bench/soak.py --duration 600 --trials 200 --concurrency 4
    .venv/bin/python bench/soak.py --duration 60 --faults engine,sandbox --json out.json
    .venv/bin/python bench/soak.py --report --soak-json out.json --fuzz-n 2000

The run: ``slr run`` (the CLI, in its own process group) in async mode with two engine
replicas and the trainer as Ray actors (a private local Ray), a tiny random model, the real
mini-swe-agent (one model call per trial) or the model-free ``oracle``, the local
(bubblewrap) backend, on examples/tasks. Its run directory lives on a small tmpfs the bench
mounts (so its disk can be made full without touching the host's).

``--n-faults`` faults, one at a time: each comes a seeded random (exponential) gap, of mean
``--duration`` / ``--n-faults`` seconds, after the run recovered from the one before, so
each recovery time is that fault's own. The kinds (``--faults``) take turns in random order:

- ``engine``: SIGKILL an engine replica's process (Ray restarts it; sessions move);
- ``worker``: SIGKILL a rollout worker (with ``--workers`` >= 2; its trials re-run);
- ``sandbox``: SIGKILL a running sandbox command's bubblewrap (the sandbox dies);
- ``coordinator``: SIGKILL ``slr run`` with everything it started, then
  ``slr run --resume``;
- ``disk``: the run directory's filesystem full for ``--disk-hold`` seconds (the tmpfs
  shrunk to what it holds), then grown back;
- ``docker-restart`` (``--backend docker``): SIGTERM the docker daemon, wait for it to
  exit, start it again on the same data root. The daemon is a private one the bench starts
  for the soak (``private_dockerd``: its own socket, data root, exec root and bridge), with
  the base image copied in from the machine's daemon; the machine's daemon is never stopped.

Every process the bench kills is one it started (a descendant of its ``slr run``, or its
private ``dockerd``); the tmpfs is its own. ``sandbox`` kills a bubblewrap process, so it
needs the local backend.

Figures are counted from the run directory after the run (``soak_audit``): trials
recorded, completed, infrastructure failures, lost (goal 0), counted twice (goal 0), steps
trained on an infrastructure failure (goal 0), and per fault kind the time from the fault's
end to the next completed trial recorded (or to the run finishing). ``--report`` writes docs/reliability.md from a
soak's JSON, a proxy fuzz run (``bench/proxy_fuzz.py --n``, or its ``--json`` output) and
the dead-client tests (tests/reliability/test_dead_client.py, run for their outcome).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from private_dockerd import PrivateDockerd
from soak_audit import audit, first_progress_after

ROOT = Path(__file__).resolve().parents[1]
SLR = str(Path(sys.executable).with_name("slr"))
KINDS = ("engine", "worker", "sandbox", "coordinator", "disk", "docker-restart")
#: Kinds that need the docker backend, and those that need the local one.
DOCKER_ONLY, LOCAL_ONLY = {"docker-restart"}, {"sandbox"}
TASKS = ["hello-world", "make-directory"]
#: How long a kill waits for its kind of process to exist (a sandbox command, a replica).
VICTIM_WAIT_S = 60.0


# -- processes the bench started ------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process visible now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (ppid, cmd)
    return table


def descendants(root: int) -> dict[int, str]:
    """Every live process below ``root``: pid -> command line."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = table[child][1]
            todo.append(child)
    return out


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


# -- the run ---------------------------------------------------------------------------------


def config_toml(
    args: argparse.Namespace, model: Path, runs: Path, dockerd_url: str | None = None
) -> str:
    import tomli_w

    per_step = args.tasks_per_step * args.n_per_task
    data: dict[str, Any] = {
        "run": {
            "name": "soak",
            "runs_dir": str(runs),
            "seed": args.seed,
            "steps": max(1, -(-args.trials // per_step)),
            "mode": "async",
            "checkpoint_every": 1,
            "engine_replicas": 2,
            "engine_resources": {"CPU": 0.25},
            "trainer_resources": {"CPU": 0.25},
        },
        "tasks": {"path": str(ROOT / "examples" / "tasks"), "include": TASKS},
        "rollout": {
            "tasks_per_step": args.tasks_per_step,
            "n_per_task": args.n_per_task,
            "concurrency": args.concurrency,
            "max_tokens": 24,
            "max_staleness": 1,
        },
        "agent": {"name": args.agent},
        "backend": {"name": "local"}
        if dockerd_url is None
        else {"name": "docker", "base_url": dockerd_url},
        "engine": {"name": "hf", "model": str(model), "threads": 1},
        "optimizer": {"name": "torch"},
    }
    if args.workers:
        data["run"].update(rollout_workers=args.workers, worker_resources={"CPU": 0.25})
    if args.agent == "mini-swe-agent":
        data["agent"].update(config_file=str(ROOT / "examples/quickstart/mini.yaml"), step_limit=1)
    return tomli_w.dumps(data)


def _remount(path: Path, size: int) -> bool:
    res = subprocess.run(
        ["mount", "-o", f"remount,size={size}", str(path)], capture_output=True, check=False
    )
    return res.returncode == 0


@contextlib.contextmanager
def small_disk(path: Path, mb: int) -> Iterator[bool]:
    """A tmpfs of at most ``mb`` MiB at ``path`` (True; it takes memory only for what it
    holds), or a plain folder where none can be mounted (False: no disk fault)."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0755", "slr-soak", str(path)],
        capture_output=True,
        text=True,
    )
    try:
        yield res.returncode == 0
    finally:
        if res.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


class Soak:
    """One soak: the run, the injector, the faults it injected (with wall times)."""

    def __init__(
        self,
        args: argparse.Namespace,
        work: Path,
        runs: Path,
        *,
        tmpfs: bool,
        dockerd: PrivateDockerd | None = None,
    ) -> None:
        self.args, self.work, self.runs, self.tmpfs = args, work, runs, tmpfs
        self.dockerd = dockerd
        self.rng = random.Random(args.seed)
        self.faults: list[dict[str, Any]] = []
        self.missed: list[dict[str, Any]] = []  # faults tried that found nothing to hit
        self.crashes: list[dict[str, Any]] = []  # the run stopped without being killed
        self.proc: subprocess.Popen[bytes] | None = None
        self.resumes = 0
        self.log = work / "slr.log"

    # -- slr run --------------------------------------------------------------------------

    def start(self, argv: list[str]) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [SLR, *argv], stdout=out, stderr=out, start_new_session=True, cwd=ROOT
            )

    def run_path(self) -> Path | None:
        found = [p for p in self.runs.iterdir() if p.is_dir()] if self.runs.is_dir() else []
        return found[0] if found else None

    def kill_everything(self) -> None:
        """SIGKILL ``slr run`` and every process it started (Ray's too, wherever they went)."""
        assert self.proc is not None
        ours = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in ours:
            _kill(pid)
        self.proc.wait()

    # -- faults ---------------------------------------------------------------------------

    def _victims(self, kind: str) -> list[int]:
        assert self.proc is not None
        procs = descendants(self.proc.pid)
        if kind == "engine":
            return [p for p, c in procs.items() if c.startswith("ray::EngineActor")]
        if kind == "worker":
            return [p for p, c in procs.items() if c.startswith("ray::RolloutWorker")]
        if kind == "sandbox":
            table = _proc_table()
            return [
                p
                for p, c in procs.items()
                if "bwrap" in c.split(" ")[0]
                and "SLR_EXEC_ID" in c
                and "bwrap" not in table.get(table.get(p, (0, ""))[0], (0, ""))[1].split(" ")[0]
            ]
        return []

    def inject(self, kind: str) -> dict[str, Any] | None:
        t0 = time.time()
        if kind in ("engine", "worker", "sandbox"):
            # the first victim to appear within VICTIM_WAIT_S (a sandbox runs a command only
            # now and then); the process table is polled, the run is not waited on
            deadline = time.monotonic() + VICTIM_WAIT_S
            while time.monotonic() < deadline and self.proc is not None:
                victims = self._victims(kind)
                if victims and _kill(victim := self.rng.choice(sorted(victims))):
                    return {"kind": kind, "at": t0, "end": time.time(), "pid": victim}
                if self.proc.poll() is not None:
                    return None
                time.sleep(0.02)
            return None
        if kind == "coordinator":
            self.kill_everything()
            run = self.run_path()
            if run is None:
                return None
            self.resumes += 1
            self.start(["run", "--resume", str(run)])
            return {"kind": kind, "at": t0, "end": time.time()}
        if kind == "disk":
            if not self.tmpfs:
                return None
            # full at once and without allocating anything: the tmpfs shrinks to what it
            # holds (a write that grew it in between makes the remount fail: measure again)
            for _ in range(20):
                used = shutil.disk_usage(self.runs).used
                if _remount(self.runs, -(-used // 4096) * 4096):
                    break
            else:
                return None
            full_at = time.time()
            time.sleep(self.args.disk_hold)  # the fault's length, whatever the run does
            _remount(self.runs, self.args.disk_mb << 20)
            return {"kind": kind, "at": full_at, "end": time.time(), "held_s": self.args.disk_hold}
        if kind == "docker-restart":
            if self.dockerd is None:
                return None
            # SIGTERM, wait for the exit, start again on the same data root: the fault lasts
            # until the daemon answers again
            self.dockerd.restart()
            return {"kind": kind, "at": t0, "end": time.time()}
        raise ValueError(kind)

    def _wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` while watching the run (it may end or crash meanwhile)."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=seconds)

    def _check_exit(self) -> bool:
        """True once the run has finished; a run that died on its own is resumed."""
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return False
        if rc == 0:
            return True
        self.crashes.append({"at": time.time(), "rc": rc, "tail": _tail(self.log)})
        run = self.run_path()
        if run is None or len(self.crashes) > self.args.max_crashes:
            return True
        self.resumes += 1
        self.start(["run", "--resume", str(run)])
        return False

    def drive(self, config: Path) -> float:
        """Run to the end, injecting faults over ``--duration`` seconds; the wall time."""
        args = self.args
        kinds = [k for k in args.faults if k != "worker" or args.workers >= 2]
        t_start = time.monotonic()
        self.start(["run", "-c", str(config), "--skip-preflight"])
        # faults start once the first trial is recorded (the run is under load by then)
        while not self._check_exit() and not self._recorded():
            self._wait(0.5)
        # --n-faults spread over about --duration seconds: exponential gaps of that mean
        mean_gap = args.duration / max(1, args.n_faults)
        order: list[str] = []
        attempts = 0
        while kinds and attempts < args.n_faults:
            attempts += 1
            # one fault at a time, so each one's time to recover is its own: the next comes
            # a random (exponential) gap after the run made progress again
            if not self._until(self._recovered, args.grace):
                break
            gap_end = time.monotonic() + self.rng.expovariate(1 / mean_gap)
            if not self._until(lambda end=gap_end: time.monotonic() >= end, mean_gap * 10):
                break
            if not order:
                order = list(kinds)[::-1]  # popped from the end: --faults' order
                if not args.in_order:
                    self.rng.shuffle(order)  # every kind as often as the others, at random
            kind = order.pop()
            fault = self.inject(kind)
            if fault is not None:
                self.faults.append(fault)
            else:  # no victim before the run ended (or none to be had): say so in the figures
                ended = self.proc is not None and self.proc.poll() is not None
                self.missed.append({"kind": kind, "run_ended": ended})
        deadline = time.monotonic() + args.grace  # to finish, once the faults are over
        while not self._check_exit():
            if time.monotonic() > deadline:
                self.crashes.append({"at": time.time(), "rc": None, "tail": "did not finish"})
                self.kill_everything()
                break
            self._wait(1.0)
        return time.monotonic() - t_start

    def _until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Watch the run (resuming it if it died) until ``done()``: True; False if the run
        finished or ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self._check_exit() or time.monotonic() > deadline:
                return False
            self._wait(0.25)
        return True

    def _recovered(self) -> bool:
        """Whether the run recorded a completed trial since the last fault ended."""
        run = self.run_path()
        if not self.faults or run is None:
            return True
        return first_progress_after(run, self.faults[-1]["end"]) is not None

    def _recorded(self) -> bool:
        run = self.run_path()
        return run is not None and any((run / "trials").glob("*.json"))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def figures(soak: Soak, wall_s: float) -> dict[str, Any]:
    run = soak.run_path()
    counted = audit(run, n_per_task=soak.args.n_per_task) if run is not None else {}
    recovery: dict[str, list[float | None]] = {}
    for f in soak.faults:
        took = first_progress_after(run, f["end"]) if run is not None else None
        f["recovered_s"] = None if took is None else round(took, 2)
        recovery.setdefault(f["kind"], []).append(f["recovered_s"])
    by_kind = {}
    for kind, times in sorted(recovery.items()):
        done = [t for t in times if t is not None]
        by_kind[kind] = {
            "injected": len(times),
            "recovered": len(done),
            "recover_mean_s": round(sum(done) / len(done), 2) if done else None,
            "recover_max_s": max(done) if done else None,
        }
    return {
        "wall_s": round(wall_s, 1),
        "duration_s": soak.args.duration,
        "seed": soak.args.seed,
        "agent": soak.args.agent,
        "backend": soak.args.backend,
        "concurrency": soak.args.concurrency,
        "rollout_workers": soak.args.workers,
        "trials_asked": soak.args.trials,
        "tmpfs": soak.tmpfs,
        "faults": by_kind,
        "missed_faults": soak.missed,
        "fault_log": [
            {
                "kind": f["kind"],
                "at": round(f["at"], 2),
                "held_s": round(f["end"] - f["at"], 2),
                "recovered_s": f["recovered_s"],
            }
            for f in soak.faults
        ],
        "crashes": len(soak.crashes),
        "crash_tails": [c["tail"] for c in soak.crashes],
        "resumes": soak.resumes,
        "finished": bool(counted) and counted.get("steps") == _steps(soak.args),
        **{k: v for k, v in counted.items() if k != "events"},
        "events": dict(counted.get("events", {})),
    }


def _steps(args: argparse.Namespace) -> int:
    return max(1, -(-args.trials // (args.tasks_per_step * args.n_per_task)))


def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    """One soak with ``args`` (see ``parser``); the figures."""
    from slr_testkit import tiny

    with tempfile.TemporaryDirectory(prefix="slr-soak-") as tmp:
        work = Path(tmp)
        model, tok = tiny.tiny_model(hidden=32, layers=1)
        model_dir = tiny.save(model, tok, work / "tiny")
        runs = work / "runs"
        with contextlib.ExitStack() as stack:
            dockerd = None
            if args.backend == "docker":
                from slr_backend_docker.base_image import BASE_TAG

                # the restart fault's daemon: the bench's own, never the machine's
                dockerd = stack.enter_context(PrivateDockerd())
                dockerd.copy_images([BASE_TAG])
            tmpfs = stack.enter_context(small_disk(runs, args.disk_mb))
            config = work / "soak.toml"
            config.write_text(config_toml(args, model_dir, runs, dockerd and dockerd.url))
            soak = Soak(args, work, runs, tmpfs=tmpfs, dockerd=dockerd)
            try:
                wall = soak.drive(config)
            finally:
                if soak.proc is not None and soak.proc.poll() is None:
                    soak.kill_everything()
            out = figures(soak, wall)
            if args.keep:
                shutil.copytree(runs, args.keep, dirs_exist_ok=True)
                shutil.copy2(soak.log, Path(args.keep) / "slr.log")
        return out


def parser() -> argparse.ArgumentParser:
    ap = harness.parser(__doc__, json_path=True)
    ap.add_argument("--duration", type=float, default=120, help="about how long faults go on")
    ap.add_argument("--trials", type=int, default=48, help="trials to train on (sets steps)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--n-per-task", type=int, default=2)
    ap.add_argument("--n-faults", type=int, default=10, help="faults over the duration")
    ap.add_argument("--faults", default="engine,sandbox,coordinator,disk",
                    help=f"comma-separated kinds of {KINDS}")  # fmt: skip
    ap.add_argument("--in-order", action="store_true",
                    help="inject --faults in the order given, not shuffled")  # fmt: skip
    ap.add_argument("--workers", type=int, default=0, help="rollout workers (Ray actors)")
    ap.add_argument("--agent", choices=["mini-swe-agent", "oracle"], default="mini-swe-agent")
    ap.add_argument("--backend", choices=["local", "docker"], default="local",
                    help="docker: on a private dockerd the bench starts (docker-restart)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--disk-mb", type=int, default=4096, help="size of the run dir's tmpfs")
    ap.add_argument("--disk-hold", type=float, default=8.0, help="seconds the disk stays full")
    ap.add_argument("--grace", type=float, default=600, help="seconds to finish after faults")
    ap.add_argument("--max-crashes", type=int, default=3, help="unplanned stops resumed")
    ap.add_argument("--keep", type=Path, default=None, help="copy the run directory here")
    ap.add_argument("--report", action="store_true", help="write docs/reliability.md")
    ap.add_argument("--soak-json", type=Path, action="append",
                    help="--report: a soak's JSON (repeat for several; default: soak now)")  # fmt: skip
    ap.add_argument("--fuzz-json", type=Path, default=None, help="--report: proxy_fuzz --json")
    ap.add_argument("--fuzz-n", type=int, default=1000, help="--report: run proxy_fuzz --n N")
    return ap


def print_table(out: dict[str, Any], report: harness.Output) -> None:
    rows = [
        ("trials recorded", out.get("trials_recorded"), "kept + discarded by resume"),
        ("completed", out.get("completed"), ""),
        ("infrastructure failures", out.get("infra_failures"), str(out.get("terminations"))),
        ("trained trials", out.get("trained_trials"), f"{out.get('steps')} steps"),
        ("lost", out.get("lost"), "goal 0"),
        ("counted twice", out.get("counted_twice"), "goal 0"),
        ("steps trained on infra", out.get("steps_trained_on_infra"), "goal 0"),
        ("unplanned stops", out.get("crashes"), f"resumes: {out.get('resumes')}"),
    ]
    report.table([("figure", "<"), ("value", ">"), ("note", "<")], rows)
    report.table(
        [("fault", "<"), "injected", "recovered", ("mean s", ".1f"), ("max s", ".1f")],
        [
            [kind, f["injected"], f["recovered"], f["recover_mean_s"], f["recover_max_s"]]
            for kind, f in out.get("faults", {}).items()
        ],
    )


def main() -> None:
    args = parser().parse_args()
    args.faults = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(args.faults) - set(KINDS))
    if unknown:
        sys.exit(f"--faults: unknown kind(s) {unknown}; choose from {', '.join(KINDS)}")
    wrong = sorted(set(args.faults) & (LOCAL_ONLY if args.backend == "docker" else DOCKER_ONLY))
    if wrong and not args.report:
        sys.exit(
            f"--faults: {wrong} cannot be injected with --backend {args.backend}; "
            f"use --backend {'local' if args.backend == 'docker' else 'docker'} for them"
        )
    if args.report:
        from soak_report import write_report

        path = write_report(args)
        print(f"wrote {path}")
        return
    out = run_soak(args)
    report = harness.Output(args)
    print_table(out, report)
    report.result(out, default=str)


if __name__ == "__main__":
    main()
