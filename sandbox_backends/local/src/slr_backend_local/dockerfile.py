"""The subset of a Dockerfile the local backend can honour on the host's own userland.

``FROM`` is not pulled: the sandbox runs on the host's ``/usr``. ``WORKDIR``, ``ENV``,
``COPY`` / ``ADD`` of local files and ``RUN`` (with the host's tools, no network) are
replayed into the task's prepared root. ``USER``, ``CMD``, ``ENTRYPOINT``, ``EXPOSE``,
``LABEL``, ``ARG`` and the like do not change what a trial sees and are ignored. Anything
else (``ADD <url>``, ``COPY --from``, heredocs) makes the task unfit for this backend.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from attrs import frozen

IGNORED = {
    "FROM",
    "USER",
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "ARG",
    "MAINTAINER",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "VOLUME",
    "SHELL",
    "ONBUILD",
}


class UnsupportedDockerfile(ValueError):
    """The Dockerfile needs something only a real image build can do."""


@frozen
class Step:
    op: str
    args: tuple[str, ...]
    line: int


def _logical_lines(text: str):
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        yield start, buf + stripped
        buf = ""
    if buf:
        yield start, buf


def parse(path: Path) -> list[Step]:
    """The Dockerfile's steps; raises ``UnsupportedDockerfile`` naming the line."""
    steps = []
    for n, line in _logical_lines(path.read_text()):
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        where = f"{path}:{n}"
        if "<<" in rest and op in ("RUN", "COPY"):
            raise UnsupportedDockerfile(f"{where}: heredocs are not supported by the local backend")
        if op in IGNORED:
            steps.append(Step(op, (rest,), n))
        elif op == "WORKDIR":
            steps.append(Step(op, (rest,), n))
        elif op == "ENV":
            steps.append(Step(op, tuple(_env_pairs(rest, where)), n))
        elif op in ("COPY", "ADD"):
            words = _words(rest)
            flags = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                raise UnsupportedDockerfile(f"{where}: {op} --from needs a multi-stage build")
            if len(words) < 2:
                raise UnsupportedDockerfile(f"{where}: {op} needs a source and a destination")
            if op == "ADD" and any(re.match(r"^[a-z]+://", w) for w in words[:-1]):
                raise UnsupportedDockerfile(f"{where}: ADD of a URL needs a real image build")
            steps.append(Step("COPY", tuple(words), n))
        elif op == "RUN":
            if rest.startswith("["):
                try:
                    argv = json.loads(rest)
                except json.JSONDecodeError as exc:
                    raise UnsupportedDockerfile(f"{where}: RUN exec form is not JSON") from exc
                steps.append(Step(op, tuple(argv), n))
            else:
                steps.append(Step(op, ("/bin/sh", "-c", rest), n))
        else:
            raise UnsupportedDockerfile(f"{where}: {op} is not supported by the local backend")
    return steps


def _words(rest: str) -> list[str]:
    if rest.startswith("["):
        return list(json.loads(rest))
    return shlex.split(rest)


def _env_pairs(rest: str, where: str):
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        # legacy form: ENV NAME value with spaces
        name, _, value = rest.partition(" ")
        yield f"{name}={value.strip()}"
        return
    for w in words:
        if "=" not in w:
            raise UnsupportedDockerfile(f"{where}: ENV {w!r} is not NAME=value")
        yield w
