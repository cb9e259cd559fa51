"""The `[algorithm]` / `[optimizer]` options in verl's terms: the table in docs/training.md
names every option of the code (and no other), each verl path exists in the installed verl's
trainer config, and an option spelled as verl spells it has verl's default unless the table
says the default differs. Earlier names fail, naming the new one."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import attrs
import pytest
import yaml
from slr_optimizer_torch.config import TorchOptimizerConfig

from slr.config import AlgorithmSection, load_config
from slr.errors import ConfigError
from slr.plugins import PluginManager

DOCS = Path(__file__).resolve().parents[3] / "docs" / "training.md"
SECTIONS = {"algorithm": AlgorithmSection, "optimizer": TorchOptimizerConfig}
ROW = re.compile(r"^\| `\[(\w+)\] (\w+)` \| (`[\w.]+`|—) \|\s*(.*?)\s*\|$")


def _table() -> dict[tuple[str, str], tuple[str | None, str]]:
    text = DOCS.read_text()
    body = text[text.index("## Options in verl's terms") :]
    body = body[: body.index("\n## ", 1)]
    rows = {}
    for line in body.splitlines():
        match = ROW.match(line)
        if match:
            section, key, path, notes = match.groups()
            rows[(section, key)] = (None if path == "—" else path.strip("`"), notes)
    return rows


def _verl_trainer_config() -> dict:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent / "trainer" / "config"
    return yaml.safe_load((folder / "_generated_ppo_trainer.yaml").read_text())


def _lookup(config: dict, path: str):
    node = config
    for part in path.split("."):
        assert isinstance(node, dict) and part in node, f"verl's config has no {path}"
        node = node[part]
    return node


def _default(field: attrs.Attribute):
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        return field.default.factory()
    return field.default


def test_the_table_names_every_option_and_only_those():
    documented = set(_table())
    in_code = {(s, f.name) for s, cls in SECTIONS.items() for f in attrs.fields(cls)}
    assert in_code - documented == set(), "options missing from docs/training.md's table"
    assert documented - in_code == set(), "the table names options the code does not have"


def test_each_verl_path_exists_and_a_verl_spelling_has_verls_default():
    verl = _verl_trainer_config()
    for (section, key), (path, notes) in _table().items():
        if path is None:
            continue
        theirs = _lookup(verl, path)
        field = attrs.fields_dict(SECTIONS[section])[key]
        ours = _default(field)
        if path.rsplit(".", 1)[-1] != key or attrs.has(type(ours)):
            continue  # another name, or a table documented on its own
        if isinstance(ours, tuple):
            ours = list(ours)
        if ours != theirs:
            assert "default" in notes, (
                f"[{section}] {key} = {ours!r} by default, verl's {path} = {theirs!r}: "
                f"the table must say the default differs"
            )


@pytest.mark.parametrize(
    ("section", "old", "new"),
    [
        ("algorithm", "kl_coef", "kl_loss_coef"),
        ("algorithm", "entropy_coef", "entropy_coeff"),
        ("optimizer", "ppo_mini_batches", "ppo_mini_batch_size"),
        ("optimizer", "grad_clip", "clip_grad"),
        ("optimizer", "gamma", "[algorithm]"),
        ("optimizer", "kl_loss_type", "[algorithm]"),
    ],
)
def test_an_earlier_name_fails_naming_the_new_one(section, old, new):
    data = {section: {old: 1}}
    with pytest.raises(ConfigError, match=re.escape(new)) as caught:
        load_config(data=data, plugins=PluginManager())
    message = str(caught.value)
    assert message.startswith(f"{section}.{old} is no longer an option")
    assert "\n" not in message
    # every key a RENAMED entry names really is gone from its class
    for cls in SECTIONS.values():
        assert not set(cls.RENAMED) & {f.name for f in attrs.fields(cls)}
