"""Harbor tasks: load a task folder, a folder of task folders, or a task index.

A task folder, exactly as Harbor lays it out::

    task.toml              [task] [metadata] [verifier] [agent] [environment] [solution]
    instruction.md         what the agent is asked to do
    environment/Dockerfile the sandbox image (the folder is the build context)
    tests/test.sh          the verifier; writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh      optional oracle solution

``task.toml`` keys follow Harbor's schema (``timeout_sec``, ``memory_mb`` ...; the older
``memory = "2G"`` / ``storage`` forms are read too). slr reads one extra table, ``[slr]``,
which Harbor ignores: ``squash_git_history`` (default true) and ``restore_git_history``
(default false) for the anti reward-hacking git squash, and ``[environment] workdir``.

A broken task raises ``BrokenTaskError`` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog
from attrs import field, frozen

from slr.contracts.network import NetworkMode, network_mode
from slr.errors import UsageError

log = structlog.get_logger()

# A phase's network after the agent phase: proxy-only is the agent phase's alone.
PHASE_NETWORKS: tuple[NetworkMode, ...] = ("full", "none")

TASK_TOML = "task.toml"
INSTRUCTION = "instruction.md"

# The paths inside the sandbox that Harbor's layout fixes.
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
LOGS_DIR = "/logs"
VERIFIER_LOGS_DIR = "/logs/verifier"
AGENT_LOGS_DIR = "/logs/agent"

DEFAULT_AGENT_TIMEOUT_S = 600.0


class BrokenTaskError(UsageError):
    """A task folder that cannot be run: missing file, invalid field. Names both."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = Path(path)


@frozen(kw_only=True)
class VerifierSettings:
    timeout_s: float = 600.0
    user: str | None = None
    env: dict[str, str] = field(factory=dict)
    network: NetworkMode = field(
        default="full", validator=lambda _, __, value: network_mode(value, allowed=PHASE_NETWORKS)
    )


@frozen(kw_only=True)
class AgentSettings:
    timeout_s: float | None = None
    user: str | None = None


@frozen(kw_only=True)
class EnvironmentSettings:
    path: Path
    """The build context (``environment/``)."""
    dockerfile: Path
    build_timeout_s: float = 600.0
    docker_image: str | None = None
    """A prebuilt image to use instead of building the Dockerfile."""
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = True
    workdir: str | None = None
    """The agent's working directory; default: the image's WORKDIR."""
    env: dict[str, str] = field(factory=dict)
    content_hash: str = ""
    """sha256 over the build context (paths, modes, contents): the image cache key."""


@frozen(kw_only=True)
class Task:
    """One Harbor task, loaded and validated. ``id`` is the folder name."""

    id: str
    path: Path
    name: str
    instruction: str
    environment: EnvironmentSettings
    verifier: VerifierSettings = field(factory=VerifierSettings)
    agent: AgentSettings = field(factory=AgentSettings)
    metadata: dict[str, Any] = field(factory=dict)
    description: str = ""
    solution_env: dict[str, str] = field(factory=dict)
    squash_git_history: bool = True
    restore_git_history: bool = False

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path | None:
        d = self.path / "solution"
        return d if (d / "solve.sh").is_file() else None

    def agent_timeout_s(self, default: float = DEFAULT_AGENT_TIMEOUT_S) -> float:
        return self.agent.timeout_s if self.agent.timeout_s is not None else default


# -- reading task.toml ---------------------------------------------------------------------

_KNOWN: dict[str, set[str]] = {
    "task": {"name", "description", "authors", "keywords"},
    "verifier": {"timeout_sec", "user", "env", "network_mode", "allowed_hosts"},
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "environment": {
        "build_timeout_sec",
        "docker_image",
        "cpus",
        "memory_mb",
        "storage_mb",
        "memory",
        "storage",
        "gpus",
        "gpu_types",
        "allow_internet",
        "network_mode",
        "allowed_hosts",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "workdir",
    },
    "solution": {"env"},
    "slr": {"squash_git_history", "restore_git_history"},
}
_TOP = {"version", "schema_version", "source", "metadata", *_KNOWN}
# Harbor keys slr reads but does not act on (yet): said once per task, not silently dropped.
_UNSUPPORTED = {
    "environment": {"gpus", "gpu_types", "healthcheck", "mcp_servers", "skills_dir"},
    "agent": {"network_mode", "allowed_hosts"},
}


class _Reader:
    """Typed access to one table of task.toml with errors that name the field."""

    def __init__(self, file: Path, data: Mapping[str, Any], section: str) -> None:
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise BrokenTaskError(file, f"[{section}] must be a table, got {raw!r}")
        self.file, self.section, self.raw = file, section, raw
        for key in sorted(set(raw) - _KNOWN[section]):
            # Harbor's schema grows; an unknown key is most likely newer Harbor, not a typo.
            log.warning("unknown task.toml key, ignored", file=str(file), key=f"{section}.{key}")
        for key in sorted(set(raw) & _UNSUPPORTED.get(section, set())):
            log.warning(
                "task.toml key not supported by slr, ignored",
                file=str(file),
                key=f"{section}.{key}",
            )

    def _bad(self, key: str, value: Any, expected: str) -> BrokenTaskError:
        return BrokenTaskError(
            self.file, f"{self.section}.{key} = {value!r} is not valid: expected {expected}"
        )

    def number(self, key: str, default: float | None, *, positive: bool = True) -> float | None:
        value = self.raw.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, value, "a number")
        if positive and value <= 0:
            raise self._bad(key, value, "a number above 0")
        return float(value)

    def integer(self, key: str, default: int) -> int:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._bad(key, value, "a whole number above 0")
        return value

    def string(self, key: str, default: str | None) -> str | None:
        value = self.raw.get(key, default)
        if value is None or isinstance(value, str):
            return value
        raise self._bad(key, value, "a string")

    def user(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value)
        raise self._bad(key, value, "a user name or uid")

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def str_map(self, key: str) -> dict[str, str]:
        value = self.raw.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) for k, v in value.items()
        ):
            raise self._bad(key, value, "a table of NAME = value strings")
        return {k: _expand_env(str(v)) for k, v in value.items()}

    def size_mb(self, key: str, legacy: str, default: int) -> int:
        if key in self.raw:
            return self.integer(key, default)
        if legacy not in self.raw:
            return default
        value = self.raw[legacy]
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*", str(value), re.IGNORECASE)
        if not m:
            raise self._bad(legacy, value, "a size like '512M' or '2G'")
        scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
        return max(1, int(float(m.group(1)) * scale))

    def network(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if value not in ("public", "no-network", "allowlist"):
            raise self._bad(key, value, "'public', 'no-network' or 'allowlist'")
        return value


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: str) -> str:
    """Harbor's ``${VAR}`` / ``${VAR:-default}`` templates, resolved from the host."""
    return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)


def _phase_network(mode: str | None, baseline: NetworkMode) -> NetworkMode:
    if mode is None:
        return baseline
    # An allowlist needs a filtering proxy slr does not have; the phase gets full network.
    return "none" if mode == "no-network" else "full"


def content_hash(folder: Path) -> str:
    """sha256 over every file under ``folder``: relative path, executable bit, contents.

    Symlinks count by their target text. The same folder anywhere gives the same hash, so an
    unchanged task reuses its image.
    """
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            h.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            mode = "x" if os.access(path, os.X_OK) else "-"
            h.update(f"F {rel} {mode} {path.stat().st_size}\n".encode())
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        elif path.is_dir():
            h.update(f"D {rel}\n".encode())
    return h.hexdigest()


def load_task(path: Path | str) -> Task:
    """Load and validate one Harbor task folder."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise BrokenTaskError(root, "is not a task folder (no such directory)")
    toml_file = root / TASK_TOML
    try:
        data = tomllib.loads(toml_file.read_text())
    except FileNotFoundError:
        raise BrokenTaskError(toml_file, "is missing; every Harbor task has a task.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise BrokenTaskError(toml_file, f"is not valid TOML: {exc}") from None
    for key in sorted(set(data) - _TOP):
        log.warning("unknown task.toml table, ignored", file=str(toml_file), key=key)

    instruction_file = root / INSTRUCTION
    if not instruction_file.is_file():
        raise BrokenTaskError(instruction_file, "is missing: the agent needs an instruction")
    instruction = instruction_file.read_text()
    if not instruction.strip():
        raise BrokenTaskError(instruction_file, "is empty")

    env_r = _Reader(toml_file, data, "environment")
    env_dir = root / "environment"
    docker_image = env_r.string("docker_image", None)
    dockerfile = env_dir / "Dockerfile"
    if docker_image is None and not dockerfile.is_file():
        raise BrokenTaskError(
            dockerfile, "is missing, and environment.docker_image is not set in task.toml"
        )
    workdir = env_r.string("workdir", None)
    if workdir is not None and not workdir.startswith("/"):
        raise BrokenTaskError(
            toml_file, f"environment.workdir = {workdir!r} is not valid: expected an absolute path"
        )
    env_network = env_r.network("network_mode")
    allow_internet = env_r.boolean("allow_internet", True)
    baseline: NetworkMode = (
        "none"
        if env_network == "no-network" or (env_network is None and not allow_internet)
        else "full"
    )
    environment = EnvironmentSettings(
        path=env_dir,
        dockerfile=dockerfile,
        build_timeout_s=env_r.number("build_timeout_sec", 600.0) or 600.0,
        docker_image=docker_image,
        cpus=env_r.number("cpus", 1.0) or 1.0,
        memory_mb=env_r.size_mb("memory_mb", "memory", 2048),
        storage_mb=env_r.size_mb("storage_mb", "storage", 10240),
        allow_internet=baseline == "full",
        workdir=workdir,
        env=env_r.str_map("env"),
        content_hash=content_hash(env_dir) if env_dir.is_dir() else "",
    )

    tests_sh = root / "tests" / "test.sh"
    if not tests_sh.is_file():
        raise BrokenTaskError(tests_sh, "is missing: the verifier runs tests/test.sh")

    ver_r = _Reader(toml_file, data, "verifier")
    verifier = VerifierSettings(
        timeout_s=ver_r.number("timeout_sec", 600.0) or 600.0,
        user=ver_r.user("user"),
        env=ver_r.str_map("env"),
        network=_phase_network(ver_r.network("network_mode"), baseline),
    )
    agent_r = _Reader(toml_file, data, "agent")
    agent = AgentSettings(timeout_s=agent_r.number("timeout_sec", None), user=agent_r.user("user"))

    task_r = _Reader(toml_file, data, "task")
    sol_r = _Reader(toml_file, data, "solution")
    slr_r = _Reader(toml_file, data, "slr")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise BrokenTaskError(toml_file, f"[metadata] must be a table, got {metadata!r}")
    return Task(
        id=root.name,
        path=root,
        name=task_r.string("name", None) or root.name,
        description=task_r.string("description", "") or "",
        instruction=instruction,
        environment=environment,
        verifier=verifier,
        agent=agent,
        metadata=metadata,
        solution_env=sol_r.str_map("env"),
        squash_git_history=slr_r.boolean("squash_git_history", True),
        restore_git_history=slr_r.boolean("restore_git_history", False),
    )


def is_task_folder(path: Path) -> bool:
    return (path / TASK_TOML).is_file()


def load_tasks(path: Path | str, *, include: Iterable[str] = (), split: str = "") -> list[Task]:
    """Tasks from a task folder, a folder of task folders, or a parquet task index.

    The index holds pointers, not content: a ``path`` column (relative to the index file's
    folder, or absolute). ``split`` keeps only an index's rows with that ``split`` value
    (``[tasks] split``); ``include`` keeps only those task ids. Any broken task fails the
    whole load: validate with ``slr check-tasks`` first.
    """
    root = Path(path)
    if root.is_file() and root.suffix == ".parquet":
        folders = _index_folders(root, split=split)
    elif split:
        raise UsageError(
            f"tasks.split = {split!r} selects rows of a parquet task index, but {root} is a "
            f"folder; point tasks.path at the index (`slr data index`), or drop tasks.split"
        )
    elif root.is_dir() and is_task_folder(root):
        folders = [root]
    elif root.is_dir():
        folders = sorted(p for p in root.iterdir() if p.is_dir() and is_task_folder(p))
        if not folders:
            raise UsageError(f"{root}: no task folders (folders with a {TASK_TOML}) inside")
    else:
        raise UsageError(f"{root}: not a task folder, a folder of tasks, or a .parquet task index")
    wanted = set(include)
    tasks = [load_task(f) for f in folders if not wanted or f.name in wanted]
    missing = wanted - {t.id for t in tasks}
    if missing:
        raise UsageError(f"tasks not found under {root}: {', '.join(sorted(missing))}")
    return tasks


def index_rows(index: Path) -> list[dict]:
    """The rows of a parquet task index (``id``, ``path``, and whatever else it holds)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(
            f"{index}: reading a parquet task index needs pyarrow (pip install pyarrow)"
        ) from None
    return pq.read_table(index).to_pylist()


def _index_folders(index: Path, *, split: str = "") -> list[Path]:
    rows = index_rows(index)
    columns = set(rows[0]) if rows else set()
    if rows and "path" not in columns:
        raise UsageError(
            f"{index}: a task index needs a 'path' column; it has {', '.join(sorted(columns))}"
        )
    if split:
        if rows and "split" not in columns:
            raise UsageError(
                f"tasks.split = {split!r}, but {index} has no 'split' column; write the index "
                f"with `slr data index`, or drop tasks.split"
            )
        rows = [r for r in rows if r.get("split") == split]
    out = []
    for row in rows:
        p = Path(row["path"])
        out.append(p if p.is_absolute() else (index.parent / p))
    return out


def write_index(tasks: Iterable[Task], index: Path) -> Path:
    """Write a parquet index of pointers (``id``, ``path`` relative to the index) to ``tasks``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "id": t.id,
            "path": os.path.relpath(t.path, Path(index).resolve().parent),
            "content_hash": t.environment.content_hash,
        }
        for t in tasks
    ]
    pq.write_table(pa.Table.from_pylist(rows), index)
    return index
