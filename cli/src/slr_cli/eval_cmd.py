"""``slr eval``: measure a policy (the base model or a checkpoint) on tasks, pass@k."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slr.config import EVAL_PLUGINS
from slr.config.cli import config_options, harbor_options, harbor_sets, resolve_config
from slr.errors import UsageError
from slr.preflight.gate import gate, skip_preflight_option
from slr.run.directory import RunDir


def _run_config(checkpoint: Path) -> Path | None:
    """The config saved by the run a checkpoint (or run folder) belongs to, if any."""
    for folder in (checkpoint, checkpoint.parent.parent):
        if (folder / RunDir.CONFIG).is_file():
            return folder / RunDir.CONFIG
    return None


@click.command("eval")
@config_options
@harbor_options
@click.option(
    "-k",
    "--samples",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Trials per task; pass@1..k is reported.",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    help="Serve these weights: RUN/checkpoints/step-NNNNNN, or a run folder RUN for its "
    "latest complete checkpoint. Without -c, the run's own config.toml is the config.",
)
@click.option(
    "--threshold",
    default=1.0,
    show_default=True,
    help="A trial succeeds when its reward is at least this.",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="Record the eval in exactly this (new) folder.",
)
@click.option("--name", help="Name of the eval run under run.runs_dir (default eval-<run.name>).")
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Finish an interrupted eval (its run folder): only trials without a record run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print eval.json, not a table.")
@skip_preflight_option
def eval_(
    config_path,
    agent,
    backend,
    engine,
    verifier,
    sets,
    samples,
    checkpoint,
    threshold,
    output,
    name,
    resume,
    as_json,
    skip_preflight,
    **harbor,
) -> None:
    """Evaluate a policy on tasks without training: k trials per task, pass@1..k.

    \b
    Examples:
      slr eval -c run.toml -k 4                          the base model ([engine] model)
      slr eval -c run.toml -k 4 --checkpoint runs/RUN    what training made of it
      slr eval --agent oracle --backend local --tasks examples/tasks
                                                         check tasks, no model loaded
      slr eval -a oracle -e docker -p TASKS -n 4         the same, with Harbor's options

    \b
    The engine, proxy, agent, backend and verifier come from the config as in `slr run`,
    and sampling uses [rollout] temperature/top_p/max_tokens (override with --set).
    Agents that call no model (oracle, nop) run without an engine.

    \b
    A trial succeeds when its reward >= --threshold. pass@k per task is the unbiased
    estimate 1 - C(n-c,k)/C(n,k) (n scored trials, c successes); the overall pass@k is its
    mean over tasks. Infrastructure failures (sandbox_error, broken_task, engine_error,
    verifier_error) are counted apart and left out of n, as training leaves them out of
    the loss.

    The eval is recorded as a run directory (RUNS_DIR/eval-<name>-<time>, or --output):
    config.toml, trials/ with trajectories and transcripts, events.jsonl, and eval.json,
    the summary.
    """
    from slr.run.evaluation import Evaluation

    if resume is not None:
        given = (config_path, agent, backend, engine, verifier, checkpoint, output, name)
        if (
            sets
            or any(v is not None for v in harbor.values())
            or samples != 1
            or threshold != 1.0
            or any(v is not None for v in given)
        ):
            raise UsageError(
                "--resume finishes an eval with the settings saved in its folder; drop the "
                "other options (start a new eval to change them)"
            )
        evaluation = Evaluation.resume(resume)
        _report(evaluation, evaluation.main(), as_json)
        return
    if checkpoint is not None and config_path is None:
        config_path = _run_config(checkpoint)
        if config_path is not None:
            click.echo(f"config: {config_path} (the checkpoint's run)", err=True)
    sets = [*sets, *harbor_sets(**harbor)]
    cfg = resolve_config(
        config_path,
        agent,
        backend,
        engine,
        None,
        verifier,
        sets,
        only_plugins=EVAL_PLUGINS,
    )
    gate(cfg, purpose="eval", skip=skip_preflight, checkpoint=checkpoint)
    evaluation = Evaluation(
        cfg, samples=samples, checkpoint=checkpoint, output=output, name=name, threshold=threshold
    )
    _report(evaluation, evaluation.main(), as_json)


def _report(evaluation, summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print_summary(summary, evaluation.run.path)
    if summary["scored"] == 0:
        raise SystemExit(1)  # nothing measured: every trial was an infrastructure failure


# the optimizer plays no part in an evaluation
eval_.params = [p for p in eval_.params if p.name != "optimizer"]


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_summary(summary: dict[str, Any], path: Path) -> None:
    k = summary["k"]
    shown = sorted({1, k})
    policy = summary["checkpoint"] or summary["model"] or "no model"
    table = Table(
        "task",
        "n",
        "ok",
        *(f"pass@{j}" for j in shown),
        "mean reward",
        "other endings",
        title=f"{summary['agent']} on {summary['backend']}: {policy}",
    )
    for task_id, t in summary["tasks"].items():
        odd = {e: n for e, n in t["terminations"].items() if e != "completed"}
        table.add_row(
            task_id,
            str(t["n"]),
            str(t["successes"]),
            *(_pct(t["pass_at"][str(j)]) for j in shown),
            _pct(t["mean_reward"]),
            ", ".join(f"{n}×{e}" for e, n in odd.items()),
        )
    table.add_section()
    table.add_row(
        "overall",
        str(summary["scored"]),
        str(summary["successes"]),
        *(_pct(summary["pass_at"][str(j)]) for j in shown),
        "",
        f"{summary['infra_failures']} infra failures (not in n)"
        if summary["infra_failures"]
        else "",
    )
    console = Console()
    console.print(table)
    passes = "  ".join(f"pass@{j}={_pct(v)}" for j, v in summary["pass_at"].items())
    if summary["engine"] is not None:
        passes += f"  weights version {summary['weights_version']}"
    console.print(passes)
    click.echo(f"recorded in {path} ({path / 'eval.json'})")
