"""Building blocks for bundle recipes (see ``slr.agents.bundles``): npm packages, a Python
interpreter with packages, and host tools (tmux) with their shared libraries.

Bundles are relocatable: nothing in them names the folder they were built in, so a backend
may mount them at any path. Everything a bundle needs comes with it, because task images
are arbitrary: a Debian image with Python 3.11 must still run a scaffold that needs Python 3.12 or Node 20. The host
and the images are expected to share a C library generation (glibc), as Debian-based task
images on a Debian host do.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from slr.agents.bundles import BuildStep, BundleError

# Libraries every glibc system has; never copied into a bundle.
_SYSTEM_LIBS = re.compile(r"^(ld-linux|libc|libm|libdl|libpthread|librt|libresolv)[.-]")


def _which(name: str, hint: str) -> Path:
    found = shutil.which(name)
    if not found:
        raise BundleError(f"{name!r} is not on PATH; {hint}")
    return Path(found).resolve()


# -- node + npm ---------------------------------------------------------------------------


def npm_packages(step: BuildStep, packages: Sequence[str], *, with_node: bool = False) -> None:
    """``npm install`` exact package specs into the bundle (``node_modules/``, with
    ``node_modules/.bin``), plus the host's ``node`` as ``bin/node`` when the package runs
    on node rather than shipping a native binary."""
    npm = _which("npm", "install npm (it comes with Node.js 20)")
    if with_node:
        (step.path / "bin").mkdir()
        shutil.copy2(_which("node", "install Node.js 20"), step.path / "bin" / "node")
    # A package.json keeps npm from walking up to a parent project.
    (step.path / "package.json").write_text('{"name": "slr-bundle", "private": true}\n')
    step.run(
        [npm, "install", "--prefix", step.path, "--no-audit", "--no-fund", "--omit=dev", *packages],
        env={"npm_config_update_notifier": "false"},
    )


# -- python -------------------------------------------------------------------------------


def find_python(version: str, explicit: str | None = None) -> Path:
    """A self-contained CPython ``version`` (e.g. ``"3.12"``): its prefix can be copied.

    Looks at ``explicit``, ``$SLR_BUNDLE_PYTHON``, ``python<version>`` on PATH, then pyenv.
    """
    candidates: list[str] = []
    for raw in (explicit, os.environ.get("SLR_BUNDLE_PYTHON")):
        if raw:
            candidates.append(raw)
    if which := shutil.which(f"python{version}"):
        candidates.append(which)
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/{version}*/bin/python{version}"), reverse=True)
    for cand in candidates:
        prefix = _prefix_of(cand)
        if prefix is not None and _self_contained(prefix, version):
            return Path(cand)
    raise BundleError(
        f"no self-contained Python {version} found (looked at: {', '.join(candidates) or 'none'}). "
        f"Install one whose prefix is its own folder (pyenv install {version}, or "
        f"uv python install {version}) and point SLR_BUNDLE_PYTHON at its python{version}."
    )


def _prefix_of(python: str) -> Path | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.base_prefix)"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 else None


def _self_contained(prefix: Path, version: str) -> bool:
    # A distribution's /usr is not: copying it would copy the whole system.
    return prefix != Path("/usr") and (prefix / "lib" / f"python{version}" / "os.py").is_file()


_PY_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "__pycache__", "site-packages"}

#: What ``python_packages`` builds, in the bundle's version (``python_bundle_version``): a
#: change to what the recipe puts in a bundle bumps it, so bundles built before are rebuilt.
#: 2: bytecode for the whole interpreter compiled at build.
PYTHON_RECIPE = 2


def python_bundle_version(package_version: str, python: str) -> str:
    """The bundle version of a Python scaffold: its package's version, the interpreter's,
    and the recipe's (``PYTHON_RECIPE``)."""
    return f"{package_version}-py{python}-r{PYTHON_RECIPE}"


# Compiles every module of the bundle's interpreter, standard library included (copied
# without its __pycache__) with hash-based pycs that are never checked against their
# sources: a bundle is read-only in the sandbox, so a module without bytecode would be
# compiled again at every start of every trial, and a source's mtime may change wherever a
# backend copies the bundle. A file that does not compile (test data, Python 2 leftovers) is
# one nothing imports; it is skipped.
_COMPILE = (
    "import compileall, py_compile, sys; compileall.compile_dir(sys.argv[1], quiet=2, "
    "workers=0, force=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)"
)


def python_packages(
    step: BuildStep,
    requirements: Sequence[str],
    *,
    version: str = "3.12",
    python: str | None = None,
) -> None:
    """Copy a Python ``version`` interpreter into ``python/`` and ``pip install``
    ``requirements`` into it.

    No venv on purpose: a venv records absolute paths, while a copied CPython finds its
    prefix from where its executable lies, so the bundle works wherever a backend mounts it.
    Run it as ``<bundle>/python/bin/python<version> -m <module>`` with ``python_env``.
    Name the bundle with ``python_bundle_version``.
    """
    interpreter = find_python(version, python)
    prefix = _prefix_of(str(interpreter))
    assert prefix is not None
    step.report(f"copying Python {version} from {prefix}")
    shutil.copytree(
        prefix,
        step.path / "python",
        symlinks=True,
        ignore=lambda d, names: [n for n in names if n in _PY_SKIP and "lib" in str(d)],
    )
    (step.path / "python" / "lib" / f"python{version}" / "site-packages").mkdir(exist_ok=True)
    own = step.path / "python" / "bin" / f"python{version}"
    env = {**python_env(step.path), "PYTHONNOUSERSITE": "1"}
    step.run([own, "-m", "ensurepip", "--default-pip"], env=env)
    pip = [own, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    step.run([*pip, "install", "--progress-bar", "off", "--no-compile", *requirements], env=env)
    step.report("compiling bytecode")
    step.run([own, "-c", _COMPILE, step.path / "python" / "lib" / f"python{version}"], env=env)


def python_bin(bundle_root: str, version: str = "3.12") -> str:
    """The bundle's interpreter, as seen from wherever the bundle is mounted."""
    return f"{bundle_root}/python/bin/python{version}"


def python_env(bundle_root: Path | str) -> dict[str, str]:
    """Environment to run the bundle's interpreter with: a shared-library CPython finds its
    ``libpython`` there in sandboxes, and the user's site-packages stay out."""
    return {"LD_LIBRARY_PATH": f"{bundle_root}/python/lib", "PYTHONNOUSERSITE": "1"}


# -- host tools ---------------------------------------------------------------------------


def host_tool(step: BuildStep, name: str, *, hint: str) -> Path:
    """Copy a host binary and its non-system shared libraries into ``tools/``.

    ``tools/bin/<name>`` is a wrapper that finds the copied libraries, so the tool runs in
    images that lack its packages. Returns the wrapper's path.
    """
    binary = _which(name, hint)
    real = step.path / "tools" / "libexec" / name
    libdir = step.path / "tools" / "lib" / name
    real.parent.mkdir(parents=True, exist_ok=True)
    libdir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, real)
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    for line in ldd.stdout.splitlines():
        match = re.match(r"\s*(\S+) => (/\S+)", line)
        if match and not _SYSTEM_LIBS.match(match.group(1)):
            shutil.copy2(match.group(2), libdir / match.group(1))
    wrapper = step.path / "tools" / "bin" / name
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    # Paths relative to the wrapper: the bundle may be mounted anywhere. The libraries come
    # last, so an image's own copies win when it has them. Shell built-ins only (no
    # dirname): the image may lack coreutils, or PATH may not reach them.
    wrapper.write_text(
        "#!/bin/sh\n"
        'tools=$(cd "${0%/*}/.." && pwd)\n'
        f'LD_LIBRARY_PATH="${{LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}}$tools/lib/{name}" '
        f'exec "$tools/libexec/{name}" "$@"\n'
    )
    wrapper.chmod(0o755)
    step.report(f"copied {binary} with {len(list(libdir.iterdir()))} libraries")
    return wrapper


def host_tools_bin(bundle_root: str) -> str:
    """The folder of ``host_tool``'s wrappers, as seen from wherever the bundle is mounted
    (for a ``PATH``; put it after the image's own folders so the image's tools win)."""
    return f"{bundle_root}/tools/bin"
