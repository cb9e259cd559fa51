"""``slr data validate / filter / index / stats``: keep the tasks worth training on."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slr.config import EVAL_PLUGINS
from slr.config.cli import config_options, resolve_config
from slr.errors import UsageError
from slr.preflight.gate import gate, skip_preflight_option
from slr.tasks import Task, load_tasks

VALIDATION = "validation.json"


def classify(oracle: list[Any], nop: list[Any]) -> tuple[str, str]:
    """``ok`` / ``flaky`` / ``broken`` / ``error`` / ``fail`` for one task's oracle and nop
    trials, and why."""
    trials = oracle + nop
    broken = [r for r in trials if str(r.termination) == "broken_task"]
    if broken:
        return "broken", (broken[0].error or "the image does not build")[-2000:]
    # each distinct error once: every repeat of a task tends to fail the same way
    errors = "; ".join(dict.fromkeys(r.error for r in trials if r.error))
    if all(r.reward is None and r.termination.is_infrastructure_failure for r in trials):
        ends = ", ".join(sorted({str(r.termination) for r in trials}))
        return "error", f"no trial reached the verifier ({ends}): {errors[:1500]}"
    o = [r.reward.value if r.reward is not None else None for r in oracle]
    n = [r.reward.value if r.reward is not None else None for r in nop]
    if all(v == 1.0 for v in o) and all(v == 0.0 for v in n):
        return "ok", ""
    if any(v == 1.0 for v in o) and any(v != 1.0 for v in o):
        return "flaky", f"oracle rewards {o}"
    if any(v == 0.0 for v in n) and any(v != 0.0 for v in n):
        return "flaky", f"nop rewards {n}"
    return "fail", f"oracle {o}, nop {n}" + (f": {errors[:500]}" if errors else "")


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-n", "--repeats", default=3, show_default=True, help="Trials per agent per task.")
@click.option("--backend", default="docker", show_default=True)
@click.option("--backend-opt", "backend_opts", multiple=True, metavar="KEY=VALUE")
@click.option("--verifier", default="harbor", show_default=True)
@click.option("-j", "--concurrency", default=4, show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Write the verdicts here (default: {VALIDATION} beside the tasks).",
)
def validate(paths, repeats, backend, backend_opts, verifier, concurrency, output) -> None:
    """Oracle must score 1 and nop 0, every one of -n times (else: flaky, fail, broken, error).

    \b
    ok      oracle 1 and nop 0 every time
    flaky   the oracle's (or nop's) rewards differ between repeats
    fail    oracle below 1 or nop above 0, every time
    broken  the image does not build (the build log is the reason)
    error   no trial reached the verifier (sandbox or verifier errors): re-run, or try
            another backend

    Exits 1 when any task is not ok.
    """
    from slr.plugins import make_plugin
    from slr.rollout.task_check import run_task_check

    tasks = [t for p in paths for t in load_tasks(p)]
    results = asyncio.run(
        run_task_check(
            tasks,
            repeats=repeats,
            backend=make_plugin("sandbox_backend", backend, backend_opts),
            verifier=make_plugin("verifier", verifier),
            concurrency=concurrency,
        )
    )
    by: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in results:
        by[(r.task_id, r.agent or "")].append(r)
    verdicts = {}
    table = Table("task", "verdict", "why", title=f"validated ({repeats}x) on {backend}")
    for t in tasks:
        verdict, why = classify(by[(t.id, "oracle")], by[(t.id, "nop")])
        verdicts[t.id] = {"verdict": verdict, "why": why}
        table.add_row(t.id, verdict, why[:200])
    out = output or (Path(paths[0]) / VALIDATION if Path(paths[0]).is_dir() else Path(VALIDATION))
    out.write_text(json.dumps(verdicts, indent=1, sort_keys=True) + "\n")
    Console().print(table)
    counts = defaultdict(int)
    for v in verdicts.values():
        counts[v["verdict"]] += 1
    click.echo(", ".join(f"{k} {n}" for k, n in sorted(counts.items())) + f"; verdicts in {out}")
    if counts.keys() - {"ok"}:
        raise SystemExit(1)


def pass_rates(eval_dir: Path, threshold: float = 1.0) -> dict[str, tuple[int, int]]:
    """(successes, trials) per task from an ``slr eval`` run folder; infrastructure failures skipped."""
    from slr.run.directory import RunDir

    rates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for trial in RunDir.open(eval_dir).trials():
        if not trial.trainable:
            continue
        rates[trial.task_id][1] += 1
        rates[trial.task_id][0] += int(trial.reward is not None and trial.reward.value >= threshold)
    return {k: (v[0], v[1]) for k, v in rates.items()}


@click.command("filter")
@click.argument("tasks_path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--eval",
    "eval_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="An `slr eval -k K` run folder over these tasks (else the eval runs here first).",
)
@config_options
@click.option(
    "-k",
    "--samples",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Without --eval: trials per task of the eval this command runs first.",
)
@click.option(
    "--threshold",
    default=1.0,
    show_default=True,
    help="A trial succeeds when its reward is at least this.",
)
@click.option("--min", "low", default=0.0, show_default=True, help="Keep pass rates above this ...")
@click.option(
    "--max", "high", default=1.0, show_default=True, help="... and below this (exclusive)."
)
@click.option("--inclusive", is_flag=True, help="Keep pass rates equal to --min / --max too.")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The kept tasks' index (.parquet) with pass_rate and difficulty.",
)
@skip_preflight_option
def filter_(
    tasks_path,
    eval_dir,
    config_path,
    agent,
    backend,
    engine,
    optimizer,
    verifier,
    sets,
    samples,
    threshold,
    low,
    high,
    inclusive,
    output,
    skip_preflight,
) -> None:
    """Keep tasks a policy solves sometimes but not always (pass rate in the band).

    \b
    Examples:
      slr data filter tasks/ -c run.toml -k 8 --min 0 --max 1 -o kept.parquet
      slr data filter tasks/ --eval runs/eval-x --min 0.1 --max 0.9 -o kept.parquet

    \b
    Without --eval, `slr eval -k K` runs first over TASKS_PATH with the config's engine,
    agent, backend and verifier (the same code and run folder as `slr eval`; its path is
    printed), then the band is applied to its pass rates. With --eval, an earlier eval's
    trials are read instead. Infrastructure failures are left out of the rates.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise UsageError(f"--min {low} / --max {high}: need 0 <= min <= max <= 1")
    if eval_dir is None:
        eval_dir = _run_eval(
            tasks_path,
            (config_path, agent, backend, engine, optimizer, verifier, sets),
            samples=samples,
            threshold=threshold,
            skip_preflight=skip_preflight,
        )
    elif config_path is not None or samples != 8:
        raise UsageError("--eval reads an earlier eval: drop -c / -k (or drop --eval to run one)")
    rates = pass_rates(eval_dir, threshold=threshold)
    tasks = load_tasks(tasks_path)
    kept: dict[str, float] = {}
    unseen = []
    for t in tasks:
        if t.id not in rates or rates[t.id][1] == 0:
            unseen.append(t.id)
            continue
        rate = rates[t.id][0] / rates[t.id][1]
        inside = (low <= rate <= high) if inclusive else (low < rate < high)
        if inside:
            kept[t.id] = rate
    if unseen:
        click.echo(
            f"{len(unseen)} tasks have no trials in {eval_dir} and are dropped: "
            f"{', '.join(unseen[:5])}",
            err=True,
        )
    write_index([t for t in tasks if t.id in kept], output, pass_rate=kept)
    click.echo(
        f"kept {len(kept)} of {len(tasks)} tasks (pass rate in "
        f"{'[' if inclusive else '('}{low}, {high}{']' if inclusive else ')'}) -> {output}"
    )


def _run_eval(
    tasks_path: Path, choices: tuple, *, samples: int, threshold: float, skip_preflight: bool
) -> Path:
    """``slr eval -k samples`` over ``tasks_path``: the same code as the command; its folder."""
    from slr.run.evaluation import Evaluation

    config_path, agent, backend, engine, _optimizer, verifier, sets = choices
    cfg = resolve_config(
        config_path,
        agent,
        backend,
        engine,
        None,
        verifier,
        [*sets, f"tasks.path={json.dumps(str(tasks_path.resolve()))}"],
        only_plugins=EVAL_PLUGINS,
    )
    gate(cfg, purpose="eval", skip=skip_preflight)
    evaluation = Evaluation(cfg, samples=samples, threshold=threshold)
    summary = evaluation.main()
    click.echo(
        f"eval: {evaluation.run.path} (pass@1 {(summary.get('pass_at') or {}).get('1')})",
        err=True,
    )
    return evaluation.run.path


def split_of(repo: str, held_out: set[str], fraction: float, seed: int) -> str:
    """train or held-out, by repository: no repository is in both."""
    if repo in held_out:
        return "held-out"
    h = int(hashlib.sha256(f"{seed}:{repo}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "held-out" if h < fraction else "train"


def difficulty(rate: float | None, t: Task) -> str:
    if rate is None:
        return str(t.metadata.get("difficulty", ""))
    return "easy" if rate >= 0.7 else "medium" if rate >= 0.3 else "hard"


def image_digest(t: Task) -> str:
    """The docker image id of the task's built image, when docker has it."""
    try:
        from slr_backend_docker import DockerBackendConfig
        from slr_backend_docker.backend import DockerBackend

        backend = DockerBackend(DockerBackendConfig())
        return backend.client.images.get(backend.image_tag(t)).id
    except Exception:
        return ""


def write_index(
    tasks: list[Task],
    index: Path,
    *,
    pass_rate: dict[str, float] | None = None,
    held_out: frozenset[str] | set[str] = frozenset(),
    fraction: float = 0.0,
    seed: int = 0,
    digests: bool = True,
) -> Path:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for t in tasks:
        repo = str(t.metadata.get("repo") or t.id)
        rate = (pass_rate or {}).get(t.id)
        rows.append(
            {
                "id": t.id,
                "path": os.path.relpath(t.path, index.resolve().parent),
                "content_hash": t.environment.content_hash,
                "source": str(t.metadata.get("source", "")),
                "repo": repo,
                "split": split_of(repo, set(held_out), fraction, seed),
                "difficulty": difficulty(rate, t),
                "pass_rate": rate,
                "fail_to_pass": int(t.metadata.get("fail_to_pass", 0) or 0),
                "image_digest": image_digest(t) if digests else "",
            }
        )
    index.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("path", pa.string()),
            ("content_hash", pa.string()),
            ("source", pa.string()),
            ("repo", pa.string()),
            ("split", pa.string()),
            ("difficulty", pa.string()),
            ("pass_rate", pa.float64()),
            ("fail_to_pass", pa.int64()),
            ("image_digest", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), index)
    return index


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--held-out",
    "held_out",
    multiple=True,
    help="A repository for the held-out split (repeatable).",
)
@click.option(
    "--held-out-fraction",
    default=0.0,
    show_default=True,
    help="Also hold out about this share of repositories (by a hash of the name).",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--only-valid", is_flag=True, help=f"Only tasks `slr data validate` marked ok ({VALIDATION})."
)
def index(paths, output, held_out, held_out_fraction, seed, only_valid) -> None:
    """One parquet index over task folders: split by repository, difficulty, source, digest."""
    tasks: list[Task] = []
    for p in paths:
        found = load_tasks(p)
        verdicts_file = Path(p) / VALIDATION
        if only_valid:
            if not verdicts_file.is_file():
                raise UsageError(
                    f"--only-valid: {verdicts_file} is missing; run `slr data validate {p}` first"
                )
            verdicts = json.loads(verdicts_file.read_text())
            found = [t for t in found if verdicts.get(t.id, {}).get("verdict") == "ok"]
        tasks += found
    write_index(tasks, output, held_out=set(held_out), fraction=held_out_fraction, seed=seed)
    click.echo(f"indexed {len(tasks)} tasks -> {output}")


@click.command()
@click.argument("index_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def stats(index_path, as_json) -> None:
    """Summarise a task index: tasks per split, source, repository and difficulty."""
    import pyarrow.parquet as pq

    rows = pq.read_table(index_path).to_pylist()
    summary: dict[str, Any] = {"tasks": len(rows)}
    for col in ("split", "source", "repo", "difficulty"):
        counts: dict[str, int] = defaultdict(int)
        for r in rows:
            counts[str(r.get(col) or "-")] += 1
        summary[col] = dict(sorted(counts.items()))
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    click.echo(f"{summary['tasks']} tasks in {index_path}")
    for col in ("split", "source", "repo", "difficulty"):
        click.echo(f"  {col}: " + ", ".join(f"{k} {n}" for k, n in summary[col].items()))
