"""Print the workspace's distribution folders: core, cli, the test kit and every plugin folder."""

from pathlib import Path

root = Path(__file__).resolve().parent.parent
members = ["core", "cli", "testkit"]
for group in ("plugins", "adapters", "sandbox_backends", "loggers"):
    for folder in sorted((root / group).glob("*/pyproject.toml")):
        if not folder.parent.name.startswith("_"):
            members.append(str(folder.parent.relative_to(root)))
print("\n".join(members))
