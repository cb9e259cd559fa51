"""``slr infer``: batch inference over a task set; predictions and SFT data (click)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slr.config import EVAL_PLUGINS
from slr.config.cli import config_options, harbor_options, harbor_sets, resolve_config
from slr.errors import UsageError
from slr.preflight.gate import gate, skip_preflight_option

__all__ = ["infer"]


@click.command("infer")
@config_options
@harbor_options
@click.option(
    "-k",
    "--samples",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Trials per task (one predictions file per sample when more than 1).",
)
@click.option(
    "--sft",
    is_flag=True,
    help="Also write sft.jsonl: the conversations of rewarded trials (rejection sampling).",
)
@click.option(
    "--threshold",
    default=1.0,
    show_default=True,
    help="A trial is rewarded (kept for --sft) when its reward is at least this.",
)
@click.option(
    "--model-name",
    help="model_name_or_path in the predictions (default: the engine's model, else the agent).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="Record the run in exactly this (new) folder.",
)
@click.option("--name", help="Name of the run under run.runs_dir (default eval-<run.name>).")
@click.option(
    "--resume",
    type=click.Path(file_okay=False, path_type=Path),
    help="Finish an interrupted inference (its run folder), then export.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@skip_preflight_option
def infer(
    config_path,
    agent,
    backend,
    engine,
    verifier,
    sets,
    samples,
    sft,
    threshold,
    model_name,
    output,
    name,
    resume,
    as_json,
    skip_preflight,
    **harbor,
) -> None:
    """Run an agent with a model over tasks, without training; export predictions and SFT data.

    \b
    Examples:
      slr infer -c run.toml -p tasks/ --output runs/inf
      slr infer -c run.toml -p tasks.parquet -k 4 --sft      rejection sampling
      slr infer --agent oracle --backend docker -p tasks/    gold patches as predictions

    \b
    The parts and sampling come from the config as in `slr eval`, and the run folder holds
    what an eval's does (config.toml, trials/, events.jsonl, eval.json), plus:
      predictions.jsonl   SWE-bench predictions: instance_id, model_name_or_path,
                          model_patch (the agent's final diff); predictions-<i>.jsonl
                          per sample with -k > 1
      sft.jsonl           with --sft: {messages, tools, task_id, trial_id, reward} per
                          trial whose reward >= --threshold
      infer.json          what was written

    The preflight (`slr preflight --for eval`) runs first, as for `slr eval`: a fatal
    check stops the command before an engine or a sandbox starts.
    """
    from slr_data.infer import Inference, export, output_paths

    if resume is not None:
        given = (config_path, agent, backend, engine, verifier, output, name, *harbor.values())
        if sets or samples != 1 or any(v is not None for v in given):
            raise UsageError(
                "--resume finishes an inference with the settings saved in its folder; drop "
                "the other options except --sft, --threshold and --model-name"
            )
        inference = Inference.resume(resume)
        inference.threshold = threshold
    else:
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
        if sft and not _calls_model(cfg):
            raise UsageError(
                f"--sft exports the conversations of an agent with the policy, but agent "
                f"{cfg.agent.name!r} calls no model; pick one that does (--agent ...)"
            )
        gate(cfg, purpose="eval", skip=skip_preflight)
        inference = Inference(cfg, samples=samples, output=output, name=name, threshold=threshold)
    summary = inference.main()
    exported = export(inference, sft=sft, model_name=model_name)
    if as_json:
        click.echo(json.dumps({"eval": summary, "exported": exported}, indent=2, sort_keys=True))
    else:
        click.echo(
            f"{summary['successes']}/{summary['scored']} trials rewarded, "
            f"{summary['infra_failures']} infrastructure failures"
        )
        for path in output_paths(inference.run.path, exported):
            click.echo(f"wrote {path}")
    if summary["scored"] == 0:
        raise SystemExit(1)


def _calls_model(cfg) -> bool:
    from slr.plugins import get_plugin_manager

    return bool(get_plugin_manager().build(cfg, "agent").needs_model)


# the optimizer plays no part in inference
infer.params = [p for p in infer.params if p.name != "optimizer"]
