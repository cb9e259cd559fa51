"""The run config: one TOML file, attrs classes, every field documented.

Core sections (``[run]``, ``[tasks]``, ``[rollout]``, ``[algorithm]``, ``[proxy]``) are
defined here. The plugin sections (``[agent]``, ``[backend]``, ``[engine]``,
``[optimizer]``, ``[verifier]``) hold ``name`` plus that plugin's own options, validated by
the ``config_cls`` it registered.
"""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import attrs
import tomli_w
from attrs import frozen, validators

from slr.cluster.ray_runtime import CLUSTER_EXTRA, check_address, ray_installed
from slr.config.structure import option, structure, unstructure
from slr.errors import ConfigError, UsageError

__all__ = ["EVAL_PLUGINS", "PLUGIN_SECTIONS", "Config", "PluginChoice", "load_config", "option"]

#: config section -> plugin kind
PLUGIN_SECTIONS: dict[str, str] = {
    "agent": "agent",
    "backend": "sandbox_backend",
    "engine": "engine",
    "optimizer": "optimizer",
    "verifier": "verifier",
}

DEFAULT_PLUGINS: dict[str, str] = {
    "agent": "mini-swe-agent",
    "backend": "local",
    "engine": "hf",
    "optimizer": "torch",
    "verifier": "harbor",
}


def _ray_address(_instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    try:
        check_address(value)
    except UsageError as exc:
        raise ValueError(f"run.{attribute.name}: {exc}") from None


def _resources(_instance: Any, attribute: attrs.Attribute, value: dict[str, float]) -> None:
    bad = {k: v for k, v in value.items() if v < 0}
    if bad:
        raise ValueError(
            f"run.{attribute.name} = {value!r}: resource amounts must be >= 0, got {bad}; "
            f"write e.g. {{CPU = 1}}"
        )


@frozen(kw_only=True)
class RunSection:
    name: str = option("run", doc="Name of the run; the run id is '<name>-<timestamp>'.")
    runs_dir: Path = option(Path("runs"), doc="Folder that holds one sub-folder per run.")
    seed: int = option(0, doc="Seed for task order, sampling and initialisation.")
    steps: int = option(
        1,
        doc="Optimizer steps to run (a step: roll out, update, sync). To roll out without training, use `slr eval`.",
        validator=validators.ge(1),
    )
    checkpoint_every: int = option(
        1, doc="Write a checkpoint every N steps.", validator=validators.ge(1)
    )
    mode: Literal["sync", "async"] = option(
        "sync",
        doc="'sync': each step rolls out its groups, then trains, then syncs the weights. "
        "'async': rollout keeps `rollout.concurrency` trials in flight while the trainer "
        "steps on finished groups and pushes weights mid-generation (partial rollout); "
        "staleness is bounded by `rollout.max_staleness`. See docs/training.md.",
    )
    loggers: list[str] = option(
        factory=list,
        doc="Metric logger plugins fed every step's metrics, e.g. ['tensorboard', 'wandb'] "
        "(pip install slr-logger-NAME); metrics.jsonl is always written.",
    )
    ray_address: str | None = option(
        None,
        doc="The Ray cluster to run on: 'auto' (the one joined with `ray start`), "
        "'host:port', 'ray://host:port', or 'local' (a private Ray on this machine). "
        "Unset: a local Ray starts only when the run needs one (engine_replicas, "
        "rollout_workers >= 1, or trainer_resources set).",
        validator=_ray_address,
    )
    engine_replicas: int = option(
        0,
        doc="Engine replicas, each a Ray actor in its own process, behind the load balancer. "
        "0: the engine runs embedded in the driver process.",
        validator=validators.ge(0),
    )
    engine_resources: dict[str, float] = option(
        factory=lambda: {"CPU": 1.0},
        doc="Ray resources each engine replica asks for, e.g. {CPU = 1}, {GPU = 1} or a "
        "custom node resource {engine = 1}; used when engine_replicas >= 1.",
        validator=_resources,
    )
    rollout_workers: int = option(
        0,
        doc="Rollout workers, each a Ray actor in its own process with its own sandboxes, "
        "agent, verifier and a node-local proxy in front of the engine replicas; trials go "
        "to the least-loaded worker, and the driver alone records them. 0: trials run in "
        "the driver process.",
        validator=validators.ge(0),
    )
    worker_resources: dict[str, float] = option(
        factory=lambda: {"CPU": 1.0},
        doc="Ray resources each rollout worker asks for, e.g. {CPU = 1} or a custom node "
        "resource {sandbox = 1} that places workers on sandbox nodes; used when "
        "rollout_workers >= 1.",
        validator=_resources,
    )
    trainer_resources: dict[str, float] | None = option(
        None,
        doc="Ray resources of the trainer, e.g. {GPU = 1}: the optimizer is built in a Ray "
        "actor placed by them, and its weights reach the engine replicas through Ray's "
        "object store. Unset: the optimizer runs in the driver process.",
        validator=validators.optional(_resources),
    )

    def ray_settings(self) -> list[str]:
        """The settings of this section that put parts of the run on Ray (empty: none do)."""
        asked = []
        if self.ray_address is not None:
            asked.append(f"ray_address = {self.ray_address!r}")
        if self.engine_replicas >= 1:
            asked.append(f"engine_replicas = {self.engine_replicas}")
        if self.rollout_workers >= 1:
            asked.append(f"rollout_workers = {self.rollout_workers}")
        if self.trainer_resources is not None:
            asked.append(f"trainer_resources = {self.trainer_resources!r}")
        return asked


@frozen(kw_only=True)
class TasksSection:
    path: Path = option(
        Path("examples/tasks"),
        doc="A folder of Harbor task folders, or a task index (.parquet) of pointers to them.",
    )
    include: list[str] = option(
        factory=list, doc="Task ids to use; empty means every task under `path`."
    )
    split: str = option(
        "",
        doc="With a parquet task index: only its rows whose `split` column has this value "
        "('train', 'held-out'; `slr data index` writes them). Empty: every row. Training on "
        "an index that holds held-out rows needs 'train' (the preflight refuses otherwise).",
    )


@frozen(kw_only=True)
class RolloutSection:
    tasks_per_step: int = option(
        2, doc="Tasks sampled for each optimizer step.", validator=validators.ge(1)
    )
    n_per_task: int = option(4, doc="Trials per task: one GRPO group.", validator=validators.ge(1))
    concurrency: int = option(4, doc="Trials running at once.", validator=validators.ge(1))
    pool_size: int = option(
        0,
        doc="Sandboxes started ahead of need for the next trials, from cached images (0: no "
        "pool). Each is fresh and serves one trial; its CPU is charged to that trial.",
        validator=validators.ge(0),
    )
    agent_timeout_multiplier: float = option(
        1.0,
        doc="Scales every task's agent timeout ([agent] timeout_sec), as Harbor's "
        "--agent-timeout-multiplier does: a slow CPU model gets 3.0, a quick smoke test 0.5. "
        "The verifier's is [verifier] timeout_multiplier.",
        validator=validators.gt(0.0),
    )
    temperature: float = option(
        1.0, doc="Sampling temperature for the policy.", validator=validators.ge(0.0)
    )
    top_p: float = option(
        1.0,
        doc="Nucleus sampling threshold (1.0: off).",
        validator=[validators.gt(0.0), validators.le(1.0)],
    )
    max_tokens: int = option(
        512, doc="Most tokens the policy may generate per model call.", validator=validators.ge(1)
    )
    max_staleness: int = option(
        1,
        doc="Async mode: how many weight versions older than the weights being updated a "
        "trained token may be. Rollout does not start a group that could exceed it; 0 is "
        "on-policy training.",
        validator=validators.ge(0),
    )
    on_stale: Literal["drop", "keep"] = option(
        "drop",
        doc="Async mode: a finished group that still exceeds max_staleness (overtaken by "
        "faster groups) is dropped ('drop') or trained anyway ('keep'); counted either way.",
    )
    dynamic_sampling: bool = option(
        False,
        doc="Leave out groups whose rewards are all equal (no GRPO signal) and roll out "
        "extra groups in their place, at most `max_oversample` per step.",
    )
    max_oversample: int = option(
        2,
        doc="With dynamic_sampling: most extra groups rolled out per step to replace "
        "groups without signal.",
        validator=validators.ge(0),
    )


@frozen(kw_only=True)
class RolloutCorrectionSection:
    """verl's rollout correction (``verl.trainer.config.algorithm.RolloutCorrectionConfig``).

    The keys are verl's field names; a key left unset takes the preset's value (or, with no
    preset, verl's default, which corrects nothing). The optimizer checks the names and
    thresholds against verl's own when it is built.
    """

    preset: str = option(
        "",
        doc="A verl preset by its RolloutCorrectionConfig method name (decoupled_token_is, "
        "decoupled_seq_is, decoupled_token_icepop, decoupled_seq_is_rs, decoupled_geo_rs, "
        "decoupled_k3_rs, bypass_ppo_clip, bypass_pg_is, ...); the keys below override it. "
        "Empty: no preset.",
    )
    rollout_is: str | None = option(
        None,
        doc="Importance-sampling weights: token, sequence, or none (no weights). Unset: the "
        "preset's (none without one).",
    )
    rollout_is_threshold: float | str | None = option(
        None,
        doc="IS bound: a number truncates weights above it (TIS); 'lower_upper' (e.g. "
        "'0.5_5.0') zeroes weights outside the band (IcePop). Unset: the preset's, else 2.0.",
    )
    rollout_is_batch_normalize: bool | None = option(
        None, doc="Normalise the IS weights to mean 1 over the batch. Unset: false."
    )
    rollout_rs: str | None = option(
        None,
        doc="Rejection sampling, verl's option names comma-separated (token_k1, token_k3, "
        "seq_sum_k1, seq_mean_k1, seq_mean_k3, seq_max_k2, ...), or none. Unset: the preset's.",
    )
    rollout_rs_threshold: float | str | None = option(
        None,
        doc="Rejection bounds, one per rollout_rs option: 'lower_upper' ratios for *_k1, an "
        "upper bound for k2 / k3. Unset: the preset's.",
    )
    bypass_mode: bool | None = option(
        None,
        doc="true: the rollout's log-probs are the PPO ratio's denominator (no recomputed "
        "old log-probs; verl's bypass_mode loss); false: decoupled (three policies). Unset: "
        "the preset's, else false.",
    )
    loss_type: str | None = option(
        None,
        doc="Bypass mode's loss: ppo_clip (the ratio to the rollout policy is clipped) or "
        "reinforce (explicit IS weights). Unset: the preset's, else ppo_clip.",
    )

    def overrides(self) -> dict[str, Any]:
        """The verl fields this table sets (everything but ``preset``), by verl's names."""
        return {
            f.name: getattr(self, f.name)
            for f in attrs.fields(RolloutCorrectionSection)
            if f.name != "preset" and getattr(self, f.name) is not None
        }

    @property
    def configured(self) -> bool:
        """Whether anything was set: otherwise the trainer runs exactly as without it."""
        return bool(self.preset) or bool(self.overrides())


@frozen(kw_only=True)
class AlgorithmSection:
    """The RL math, by verl's names with verl's meanings (the table in docs/training.md
    gives each key's verl config path): verl's ``algorithm.*`` and the loss fields of its
    ``actor_rollout_ref.actor``. How a trainer runs it (model, AdamW, batching) is
    ``[optimizer]``."""

    RENAMED: ClassVar[dict[str, str]] = {
        "kl_coef": "it set a KL *loss* to the reference model (verl's "
        "actor.kl_loss_coef), not verl's in-reward KL penalty (algorithm.kl_ctrl.kl_coef, "
        "not supported). Write use_kl_loss = true and kl_loss_coef = VALUE in [algorithm]",
        "entropy_coef": "write entropy_coeff (verl's actor.entropy_coeff, same meaning)",
    }

    adv_estimator: str = option(
        "grpo", doc="verl advantage estimator by name: grpo, rloo, reinforce_plus_plus, gae, ..."
    )
    policy_loss: str = option(
        "vanilla",
        doc="verl policy loss by name (verl's actor.policy_loss.loss_mode): vanilla (PPO "
        "clip), gspo, cispo, clip_cov, ...",
    )
    clip_ratio_low: float = option(0.2, doc="PPO clip range below 1.")
    clip_ratio_high: float = option(0.2, doc="PPO clip range above 1.")
    use_kl_loss: bool = option(
        False,
        doc="Add a KL loss to the reference model to the policy loss (verl's actor "
        "use_kl_loss; the reference is a frozen copy of the initial policy).",
    )
    kl_loss_coef: float = option(
        0.001,
        doc="Weight of the KL loss when use_kl_loss is true (verl's actor kl_loss_coef).",
        validator=validators.ge(0.0),
    )
    kl_loss_type: str = option(
        "low_var_kl",
        doc="verl KL estimator for the KL loss: kl (k1), mse (k2), low_var_kl (k3), ...",
    )
    entropy_coeff: float = option(
        0.0, doc="Weight of the entropy bonus (0: off; verl's actor entropy_coeff)."
    )
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = option("token-mean", doc="How per-token losses are aggregated (verl's names).")
    loss_scale_factor: int | None = option(
        None,
        doc="seq-mean-token-sum-norm divisor; unset: the mini-batch's longest row. Set it "
        "for a normalisation constant across steps.",
        validator=validators.optional(validators.ge(1)),
    )
    gamma: float = option(1.0, doc="Discount for gae and reinforce_plus_plus.")
    lam: float = option(1.0, doc="GAE lambda.")
    norm_adv_by_std_in_grpo: bool = option(
        True, doc="GRPO: divide by the group's reward std (false: Dr. GRPO)."
    )
    routing_replay: bool = option(
        False,
        doc="MoE routing replay (R3; verl's router_replay.mode = 'R3'): the trainer's forward "
        "pass routes each token through the experts the rollout engine chose (gate "
        "weights recomputed from the trainer's own router logits, so the router still "
        "learns). Needs a MoE model and [engine] return_routed_experts = true.",
    )
    rollout_correction: RolloutCorrectionSection = option(
        factory=RolloutCorrectionSection,
        doc="Off-policy correction between the rollout's behaviour log-probs and the "
        "trainer's (verl's rollout correction, by verl's names; off unless set).",
    )


@frozen(kw_only=True)
class ProxySection:
    host: str = option("127.0.0.1", doc="Address the in-process proxy binds to.")
    port: int = option(0, doc="Port for the proxy; 0 picks a free one.", validator=validators.ge(0))
    on_history_rewrite: Literal["new_segment", "recompute"] = option(
        "new_segment",
        doc="When the agent rewrites history (compaction, edited or dropped turns) a new "
        "segment starts. 'new_segment': its prompt is the rewritten history, rendered and "
        "tokenized afresh. 'recompute': it reuses the recorded ids of the longest unchanged "
        "run of leading turns as context (mask 0) and tokenizes only the rest.",
    )
    tool_parser: str = option(
        "hermes",
        doc="Parser for the model's native tool-call syntax, by vLLM's --tool-call-parser "
        "names: hermes (<tool_call>{json}</tool_call>: Qwen2.5, Qwen3), qwen3_coder, glm45, "
        "kimi_k2, openai, ... (slr-toolparsers-verl; the table in docs/proxy.md).",
    )
    http_parser: Literal["auto", "httptools", "h11"] = option(
        "auto",
        doc="HTTP/1.1 parser of the proxy's server (uvicorn's --http). 'httptools': the C "
        "parser (a dependency of slr-core), 11-27% less proxy CPU per request than 'h11', "
        "the pure-Python one (bench/proxy_overhead.py); 'auto': httptools when it imports, "
        "else h11.",
    )
    max_body_bytes: int = option(
        8 * 1024 * 1024, doc="Largest request body accepted.", validator=validators.ge(1024)
    )
    header_timeout_s: float = option(
        10.0,
        doc="A request's line and headers must arrive within this many seconds of its first "
        "byte (or of the connection opening); a client that trickles them is answered 408 and "
        "cut off.",
        validator=validators.gt(0),
    )
    body_timeout_s: float = option(
        60.0,
        doc="A request's whole body must arrive within this many seconds of its headers; a "
        "slower client is answered 408 and cut off.",
        validator=validators.gt(0),
    )
    write_timeout_s: float = option(
        30.0,
        doc="A client that reads nothing of its answer for this many seconds, while the proxy "
        "has more than 64 KiB waiting for it, is cut off and its generation cancelled (a slow "
        "reader cannot hold the engine).",
        validator=validators.gt(0),
    )
    client_sampling: Literal["ignore", "honor"] = option(
        "ignore",
        doc="What to do with the temperature / top_p / top_k an agent sends. 'ignore': sample "
        "with [rollout]'s values, so the behaviour log-probs are taken at the temperature the "
        "trainer scores with (training needs this). 'honor': use the agent's values (serving).",
    )
    model_names: list[str] = option(
        factory=lambda: ["policy"],
        doc="Model names the proxy answers to (what agents pass as `model`); a request for "
        "any other name gets a not-found error in its API's shape. Empty: accept any name.",
    )


@frozen(kw_only=True)
class PluginChoice:
    """A plugin section: which plugin, plus its own options (its ``config_cls`` instance)."""

    name: str
    options: Any = None


@frozen(kw_only=True)
class Config:
    run: RunSection = option(factory=RunSection, doc="The run itself.")
    tasks: TasksSection = option(factory=TasksSection, doc="Which tasks to train on.")
    rollout: RolloutSection = option(factory=RolloutSection, doc="How trials are rolled out.")
    algorithm: AlgorithmSection = option(
        factory=AlgorithmSection,
        doc="The RL algorithm, by verl's option names with verl's meanings (docs/training.md "
        "maps each to verl's config path).",
    )
    proxy: ProxySection = option(factory=ProxySection, doc="The in-process proxy.")
    agent: PluginChoice = option(doc="The agent scaffold plugin and its options.")
    backend: PluginChoice = option(doc="The sandbox backend plugin and its options.")
    engine: PluginChoice = option(doc="The inference engine plugin and its options.")
    optimizer: PluginChoice = option(doc="The optimizer plugin and its options.")
    verifier: PluginChoice = option(doc="The verifier plugin and its options.")

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in attrs.fields(Config):
            value = getattr(self, f.name)
            if isinstance(value, PluginChoice):
                out[f.name] = {"name": value.name, **(unstructure(value.options) or {})}
            else:
                out[f.name] = unstructure(value)
        return out

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (['a', 'b'], value); the value is read as TOML, else as a string."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r} must look like section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [p.strip() for p in key.strip().split(".")], value


def _apply(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: {'.'.join(keys[: i + 1])} is not a table")
        node = child
    node[keys[-1]] = value


class _Registered(Protocol):
    @property
    def config_cls(self) -> type | None: ...


class PluginLookup(Protocol):
    """What loading a config needs of the plugin manager (``slr.plugins.PluginManager``
    is one): each chosen plugin's options class, or an error naming what is installed."""

    def get(self, kind: str, name: str) -> _Registered: ...


#: The plugin sections an evaluation builds (no optimizer): ``only_plugins`` of
#: ``load_config`` for ``slr eval``, ``slr infer``, ``slr data filter`` and their preflight.
EVAL_PLUGINS = ("agent", "backend", "engine", "verifier")


def load_config(
    path: Path | None = None,
    *,
    plugins: PluginLookup,
    choose: dict[str, str | None] | None = None,
    sets: list[str] | tuple[str, ...] = (),
    data: dict[str, Any] | None = None,
    only_plugins: tuple[str, ...] | None = None,
) -> Config:
    """Read, override and validate a run config. Fails before anything starts, by name.

    ``only_plugins`` names the plugin sections a command needs (``slr serve`` needs only
    ``engine``); the others keep their names but are not looked up or validated.

    An optimizer's options class may list the ``[algorithm]`` names it runs in a class-level
    ``ACCEPTS: ClassVar[dict[str, tuple[str, ...]]]`` (``{"adv_estimator": ("grpo", ...)}``):
    any other value of those keys fails here, with the closest accepted name.
    """
    if data is None:
        data = {}
        if path is not None:
            try:
                data = tomllib.loads(Path(path).read_text())
            except FileNotFoundError:
                raise ConfigError(f"config file {str(path)!r} does not exist") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for section, name in (choose or {}).items():
        if name is not None:
            data.setdefault(section, {})["name"] = name
    for assignment in sets:
        _apply(data, *parse_set(assignment))

    core = {k: v for k, v in data.items() if k not in PLUGIN_SECTIONS}
    for key in core:
        if key not in CORE_SECTIONS:
            allowed = [*CORE_SECTIONS, *PLUGIN_SECTIONS]
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config section {key!r}.{hint} Sections: {', '.join(allowed)}"
            )
    base = structure(core, _CoreOnly, path="")
    on_ray = base.run.ray_settings()
    if on_ray and not ray_installed():
        raise ConfigError(
            f"[run] {', '.join(on_ray)} places parts of the run on Ray, which is not "
            f"installed: {CLUSTER_EXTRA}, or remove those settings to run in one process"
        )
    for logger in base.run.loggers:
        plugins.get("logger", logger)  # an unknown logger fails here, with what is installed
    choices = {}
    for section, kind in PLUGIN_SECTIONS.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"[{section}] must be a table, got {raw!r}")
        raw = dict(raw)
        name = raw.pop("name", DEFAULT_PLUGINS[section])
        if not isinstance(name, str):
            raise ConfigError(f"{section}.name = {name!r} is not valid: expected a plugin name")
        if only_plugins is not None and section not in only_plugins:
            choices[section] = PluginChoice(name=name, options=raw or None)
            continue
        registration = plugins.get(kind, name)
        if registration.config_cls is None:
            if raw:
                raise ConfigError(
                    f"{section} {name!r} takes no options, but [{section}] sets "
                    f"{', '.join(sorted(raw))}; remove them"
                )
            options = None
        else:
            options = structure(raw, registration.config_cls, path=section)
        choices[section] = PluginChoice(name=name, options=options)
    if "optimizer" in choices and (only_plugins is None or "optimizer" in only_plugins):
        _check_accepted(base.algorithm, choices["optimizer"])
    return Config(**{f.name: getattr(base, f.name) for f in attrs.fields(_CoreOnly)}, **choices)


def _check_accepted(algorithm: AlgorithmSection, optimizer: PluginChoice) -> None:
    """``[algorithm]`` names the chosen optimizer runs (its options class's ``ACCEPTS``):
    a misspelt estimator or loss fails at load, not when the optimizer is built."""
    accepts: dict[str, tuple[str, ...]] = getattr(type(optimizer.options), "ACCEPTS", {})
    for key, names in accepts.items():
        value = getattr(algorithm, key)
        if value in names:
            continue
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"algorithm.{key} = {value!r} is not one the {optimizer.name!r} optimizer "
            f"runs.{hint} Accepted: {', '.join(names)}"
        )


@frozen(kw_only=True)
class _CoreOnly:
    """The core sections alone, so unknown top-level keys are caught by one structurer."""

    run: RunSection = option(factory=RunSection, doc="")
    tasks: TasksSection = option(factory=TasksSection, doc="")
    rollout: RolloutSection = option(factory=RolloutSection, doc="")
    algorithm: AlgorithmSection = option(factory=AlgorithmSection, doc="")
    proxy: ProxySection = option(factory=ProxySection, doc="")


CORE_SECTIONS: dict[str, type] = typing.get_type_hints(_CoreOnly)
