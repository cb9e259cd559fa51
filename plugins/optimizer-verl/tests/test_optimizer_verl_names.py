"""The verl optimizer's options in verl's terms, both ways: each maps to a path that exists in
the installed verl's trainer config, an option the torch optimizer has too maps to the same
path as in docs/training.md's table, the verl optimizer's table there names every option,
and verl's config classes are built with the mapped values."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import attrs
import pytest
import yaml
from slr_optimizer_verl.config import VerlOptimizerConfig
from slr_optimizer_verl.verl_names import VERL_PATHS, from_verl, to_verl, worker_config

from slr.errors import ConfigError

DOCS = Path(__file__).resolve().parents[3] / "docs" / "training.md"
ROW = re.compile(r"^\| `\[(\w+)\] (\w+)` \| (`[\w.]+`|—) \|\s*(.*?)\s*\|$")

CHANGED = VerlOptimizerConfig(
    model="some/folder",
    device="cpu",
    dtype="bfloat16",
    strategy="fsdp",
    lr=3e-5,
    weight_decay=0.0,
    betas=(0.8, 0.95),
    clip_grad=0.5,
    micro_batch_tokens=1234,
    ppo_epochs=2,
    ppo_mini_batch_size=4,
    old_logprobs="rollout",
    gradient_checkpointing=True,
    lora_rank=8,
    lora_alpha=32.0,
    target_modules=["q_proj", "v_proj"],
    use_fused_kernels=True,
    cliprange_value=0.2,
    critic_model="critic/folder",
    critic_lr=2e-6,
)


def _section(title: str) -> dict[str, str | None]:
    text = DOCS.read_text()
    body = text[text.index(title) :]
    body = body[: body.index("\n## ", 1)]
    rows = {}
    for line in body.splitlines():
        match = ROW.match(line)
        if match and match.group(1) == "optimizer":
            path = match.group(3)
            rows[match.group(2)] = None if path == "—" else path.strip("`")
    return rows


def _verl_yaml() -> dict:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent / "trainer" / "config"
    return yaml.safe_load((folder / "_generated_ppo_trainer.yaml").read_text())


def test_options_round_trip_through_verls_names():
    verl = to_verl(CHANGED)
    assert verl["actor_rollout_ref.actor.fsdp_config.model_dtype"] == "bf16"
    assert verl["actor_rollout_ref.actor.optim.betas"] == [0.8, 0.95]
    assert verl["algorithm.rollout_correction.bypass_mode"] is True
    assert from_verl(verl) == CHANGED
    assert to_verl(from_verl(verl)) == verl


def test_nested_verl_settings_are_read_and_unknown_paths_ignored():
    nested = {
        "actor_rollout_ref": {
            "actor": {"optim": {"lr": 2e-6, "clip_grad": 0.0}, "ppo_epochs": 3, "unknown": 1},
            "model": {"path": "m"},
        },
        "trainer": {"device": "cuda", "n_gpus_per_node": 1},
    }
    opts = from_verl(nested)
    assert (opts.lr, opts.clip_grad, opts.ppo_epochs, opts.model, opts.device) == (
        2e-6,
        0.0,
        3,
        "m",
        "cuda",
    )


def test_a_verl_value_without_a_counterpart_fails_naming_the_path():
    with pytest.raises(ConfigError, match="model_dtype = 'fp8'"):
        from_verl({"actor_rollout_ref.actor.fsdp_config.model_dtype": "fp8"})
    with pytest.raises(ConfigError, match="ppo_epochs"):
        from_verl({"actor_rollout_ref.actor.ppo_epochs": 0})


def test_every_path_exists_in_verls_trainer_config():
    config = _verl_yaml()
    for name, path in VERL_PATHS.items():
        node = config
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"{name}: verl has no {path}"
            node = node[part]


def test_shared_options_map_as_the_torch_table_says_and_the_verl_table_is_complete():
    torch_table = _section("## Options in verl's terms")
    verl_table = _section("## The verl optimizer")
    fields = {f.name for f in attrs.fields(VerlOptimizerConfig)}
    assert set(verl_table) == fields, "docs/training.md's verl optimizer table vs the options"
    for name, path in VERL_PATHS.items():
        assert verl_table[name] == path, f"{name}: docs say {verl_table[name]}, code {path}"
        if name in torch_table:
            assert torch_table[name] == path, f"{name} maps elsewhere than the torch table's"
    for name in fields - set(VERL_PATHS):
        assert verl_table[name] is None


def test_worker_config_is_verls_own_classes_with_the_mapped_values(tiny_model_dir):
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig

    opts = attrs.evolve(CHANGED, clip_grad=0.0, eps=1e-6, dtype="float32")
    cfg = worker_config(opts, model_path=str(tiny_model_dir), device="cpu")
    assert isinstance(cfg.engine_config, FSDPEngineConfig)
    assert isinstance(cfg.optimizer_config, FSDPOptimizerConfig)
    assert isinstance(cfg.model_config, HFModelConfig)
    assert cfg.model_config.path == str(tiny_model_dir)
    assert cfg.engine_config.strategy == "fsdp"
    assert cfg.engine_config.model_dtype == "fp32"
    assert cfg.engine_config.mixed_precision["param_dtype"] == "fp32"
    assert cfg.engine_config.max_token_len_per_gpu == 1234
    assert cfg.optimizer_config.lr == 3e-5
    assert tuple(cfg.optimizer_config.betas) == (0.8, 0.95)
    assert math.isinf(cfg.optimizer_config.clip_grad)  # 0 = no clipping
    assert cfg.optimizer_config.override_optimizer_config == {"eps": 1e-6}
    # with LoRA verl saves the adapter alone and no Hugging Face model (the adapter folder
    # is the servable weights); full weights get the Hugging Face model
    assert "hf_model" not in cfg.checkpoint_config.save_contents
    full = worker_config(
        attrs.evolve(opts, lora_rank=0), model_path=str(tiny_model_dir), device="cpu"
    )
    assert "hf_model" in full.checkpoint_config.save_contents
    assert full.checkpoint_config.save_lora_only is False
    # LoRA and the fused path are verl's model options
    assert (cfg.model_config.lora_rank, cfg.model_config.lora_alpha) == (8, 32.0)
    assert list(cfg.model_config.target_modules) == ["q_proj", "v_proj"]
    assert cfg.model_config.use_fused_kernels is True
    assert cfg.model_config.fused_kernel_options["impl_backend"] == "torch"
    assert cfg.checkpoint_config.save_lora_only is True


def test_reference_and_critic_configs_are_verls_roles(tiny_model_dir):
    from slr_optimizer_verl.verl_names import (
        critic_config,
        critic_worker_config,
        ref_worker_config,
    )
    from verl.workers.config import FSDPCriticConfig

    from slr.config import AlgorithmSection

    path = str(tiny_model_dir)
    opts = attrs.evolve(CHANGED, dtype="float32")
    ref = ref_worker_config(opts, model_path=path, device="cpu")
    assert ref.model_config.lora_rank == 0, "the reference is the initial policy, no adapter"
    # verl's forward-only engine pins host memory (needs an accelerator); on the CPU it is
    # a training engine that never steps
    assert ref.engine_config.forward_only is False
    assert ref_worker_config(opts, model_path=path, device="cuda").engine_config.forward_only
    critic = critic_worker_config(opts, model_path=path, tokenizer_path=path, device="cpu")
    assert critic.model_type == "value_model"
    assert critic.optimizer_config.lr == 2e-6
    assert critic.model_config.use_fused_kernels is False
    loss_config = critic_config(AlgorithmSection(loss_agg_mode="seq-mean-token-mean"), opts)
    assert isinstance(loss_config, FSDPCriticConfig)
    assert (loss_config.cliprange_value, loss_config.loss_agg_mode) == (
        0.2,
        "seq-mean-token-mean",
    )
