"""A Dockerfile read the way docker's builder reads one stage: instructions, ARG, substitution.

``parse`` reads the file (line continuations, comments, the ``# escape=`` directive, JSON
and shell forms) and resolves ``FROM`` with the ARGs declared before it. ``Dockerfile.steps``
then walks the stage from the base image's own environment and yields steps whose words are
already expanded: ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR:+alt}`` from the ARGs
and ENVs in scope at that line (single quotes and ``\\$`` keep a ``$`` literal), each ENV
seeing the values from before its own line, as docker does. A RUN in shell form is not
expanded here: its shell does that, with the ARGs and ENVs in its environment.

What a trial cannot see (``CMD``, ``EXPOSE``, ``LABEL`` ...) is dropped. What needs a real
image build (``ADD <url>``, ``COPY --from``, more than one stage, heredocs) raises
``UnsupportedDockerfile`` naming the line.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from attrs import field, frozen

#: Instructions that change nothing a trial sees.
NO_EFFECT = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "MAINTAINER",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "VOLUME",
    "ONBUILD",
}
KNOWN = NO_EFFECT | {"FROM", "ARG", "ENV", "WORKDIR", "COPY", "ADD", "RUN", "USER", "SHELL"}
DEFAULT_SHELL = ("/bin/sh", "-c")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_]")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


class UnsupportedDockerfile(ValueError):
    """The Dockerfile needs something only a real image build can do, or is malformed."""


@frozen
class Instruction:
    """One logical line: ``op`` upper-cased, ``rest`` as written, its first line number."""

    op: str
    rest: str
    line: int


@frozen
class Step:
    """One expanded step. ``op`` is ``WORKDIR`` (``args[0]``: an absolute path), ``ENV``
    (``NAME=value`` pairs), ``COPY`` (sources..., destination; ``ADD`` of a local file too,
    with ``add`` set), ``RUN`` (the argv; ``env``: the ARGs and ENVs it runs with) or ``USER``.
    """

    op: str
    args: tuple[str, ...]
    line: int
    env: tuple[tuple[str, str], ...] = ()
    add: bool = False


@frozen(kw_only=True)
class Dockerfile:
    path: Path
    base: str
    """The ``FROM`` image, with the ARGs declared before it expanded."""
    instructions: tuple[Instruction, ...]
    build_args: Mapping[str, str] = field(factory=dict)
    global_args: Mapping[str, str] = field(factory=dict)
    escape: str = "\\"

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def steps(self, image_env: Mapping[str, str]) -> list[Step]:
        """The stage's steps, expanded from the base image's environment ``image_env``."""
        env: dict[str, str] = dict(image_env)
        args: dict[str, str] = {}
        shell = DEFAULT_SHELL
        workdir = "/"
        out: list[Step] = []
        for ins in self.instructions:
            where = self.where(ins.line)
            scope = {**args, **env}  # an ENV wins over an ARG of the same name
            if ins.op == "ARG":
                for name, default in _arg_decls(ins.rest, scope, where, self.escape):
                    if name in self.build_args:
                        args[name] = self.build_args[name]
                    elif default is not None:
                        args[name] = default
                    elif name in self.global_args:
                        args[name] = self.global_args[name]
            elif ins.op == "ENV":
                pairs = _env_pairs(ins.rest, scope, where, self.escape)
                env.update(pairs)
                out.append(Step("ENV", tuple(f"{k}={v}" for k, v in pairs), ins.line))
            elif ins.op == "WORKDIR":
                value = expand_word(ins.rest, scope, where, self.escape)
                workdir = posixpath.normpath(posixpath.join(workdir, value))
                out.append(Step("WORKDIR", (workdir,), ins.line))
            elif ins.op == "USER":
                user = expand_word(ins.rest, scope, where, self.escape)
                out.append(Step("USER", (user,), ins.line))
            elif ins.op == "SHELL":
                shell = tuple(_json_list(ins.rest, where, "SHELL"))
            elif ins.op in ("COPY", "ADD"):
                out.append(_copy_step(ins, scope, where, self.escape))
            elif ins.op == "RUN":
                rest = ins.rest
                while rest.startswith("--"):  # --mount / --network / --security: BuildKit's
                    flag, _, rest = rest.partition(" ")
                    if flag.startswith("--mount"):
                        raise UnsupportedDockerfile(f"{where}: RUN {flag} needs BuildKit")
                    rest = rest.lstrip()
                if rest.startswith("["):
                    argv = tuple(_json_list(rest, where, "RUN"))
                else:
                    if _HEREDOC.search(rest):
                        raise UnsupportedDockerfile(f"{where}: heredocs need a real image build")
                    argv = (*shell, rest)
                run_env = {**args, **env}
                out.append(Step("RUN", argv, ins.line, env=tuple(run_env.items())))
        return out


def parse(path: Path, build_args: Mapping[str, str] | None = None) -> Dockerfile:
    """Read ``path``; raises ``UnsupportedDockerfile`` naming the line for what cannot run."""
    build_args = dict(build_args or {})
    text = path.read_text()
    global_args: dict[str, str] = {}
    base: str | None = None
    body: list[Instruction] = []
    lines = text.splitlines()
    escape = _escape(lines)
    for ins in _instructions(lines, escape):
        where = f"{path}:{ins.line}"
        if ins.op not in KNOWN:
            raise UnsupportedDockerfile(f"{where}: unknown instruction {ins.op}")
        if ins.op in ("RUN", "COPY", "ADD") and _HEREDOC.search(ins.rest):
            raise UnsupportedDockerfile(f"{where}: heredocs need a real image build")
        if ins.op == "FROM":
            if base is not None:
                raise UnsupportedDockerfile(
                    f"{where}: a second FROM (a multi-stage build) needs a real image build"
                )
            words = expand_words(ins.rest, global_args, where, escape)
            words = [w for w in words if not w.startswith("--platform")]
            if not words:
                raise UnsupportedDockerfile(f"{where}: FROM names no image")
            base = words[0]
        elif base is None:
            if ins.op != "ARG":
                raise UnsupportedDockerfile(f"{where}: {ins.op} before FROM")
            for name, default in _arg_decls(ins.rest, global_args, where, escape):
                value = build_args.get(name, default)
                if value is not None:
                    global_args[name] = value
        elif ins.op not in NO_EFFECT:
            body.append(ins)
    if base is None:
        raise UnsupportedDockerfile(f"{path}: no FROM instruction")
    return Dockerfile(
        path=path,
        base=base,
        instructions=tuple(body),
        build_args=build_args,
        global_args=global_args,
        escape=escape,
    )


# -- reading lines -------------------------------------------------------------------------


def _escape(lines: list[str]) -> str:
    escape = "\\"
    # Parser directives: only at the very top, before any comment, blank line or instruction.
    for raw in lines:
        m = re.fullmatch(r"#\s*([A-Za-z]+)\s*=\s*(\S+)\s*", raw)
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise UnsupportedDockerfile(f"escape directive {m.group(2)!r}: want \\ or `")
            escape = m.group(2)
    return escape


def _instructions(lines: list[str], escape: str) -> Iterator[Instruction]:
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            # A comment or a blank line inside a continuation is dropped, not an end.
            continue
        if not buf:
            start = n
        if stripped.endswith(escape):
            buf.append(raw.rstrip()[:-1])
            continue
        buf.append(raw)
        yield _instruction(" ".join(part.strip() for part in buf if part.strip()), start)
        buf = []
    if buf:
        yield _instruction(" ".join(part.strip() for part in buf if part.strip()), start)


def _instruction(line: str, n: int) -> Instruction:
    op, _, rest = line.partition(" ")
    return Instruction(op.upper(), rest.strip(), n)


def _json_list(rest: str, where: str, op: str) -> list[str]:
    try:
        value = json.loads(rest)
    except json.JSONDecodeError as exc:
        raise UnsupportedDockerfile(f"{where}: {op} [...] is not a JSON list: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UnsupportedDockerfile(f"{where}: {op} [...] must be a JSON list of strings")
    return value


# -- substitution ----------------------------------------------------------------------------


def expand_words(text: str, scope: Mapping[str, str], where: str, escape: str = "\\") -> list[str]:
    """Split ``text`` into words as docker does (quotes, escapes), expanding variables."""
    return _Lexer(text, scope, where, escape).words()


def expand_word(text: str, scope: Mapping[str, str], where: str, escape: str = "\\") -> str:
    """``text`` as one word (WORKDIR, USER, a legacy ENV value): quotes removed, expanded."""
    return _Lexer(text, scope, where, escape).word()


class _Lexer:
    def __init__(self, text: str, scope: Mapping[str, str], where: str, escape: str) -> None:
        self.escape = escape
        self.text = text
        self.scope = scope
        self.where = where
        self.i = 0

    def _peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def words(self) -> list[str]:
        out: list[str] = []
        while True:
            while self._peek().isspace():
                self.i += 1
            if not self._peek():
                return out
            out.append(self._until(space_ends=True))

    def word(self) -> str:
        return self._until(space_ends=False).strip()

    def _until(self, *, space_ends: bool, stop: str = "") -> str:
        out: list[str] = []
        while (c := self._peek()) and c not in stop:
            if space_ends and c.isspace():
                break
            self.i += 1
            if c == self.escape:
                out.append(self._take_escaped())
            elif c == "'":
                end = self.text.find("'", self.i)
                if end < 0:
                    raise UnsupportedDockerfile(f"{self.where}: unterminated ' quote")
                out.append(self.text[self.i : end])
                self.i = end + 1
            elif c == '"':
                out.append(self._double_quoted())
            elif c == "$":
                out.append(self._variable())
            else:
                out.append(c)
        return "".join(out)

    def _take_escaped(self) -> str:
        c = self._peek()
        if not c:
            return self.escape
        self.i += 1
        return c

    def _double_quoted(self) -> str:
        out: list[str] = []
        while True:
            c = self._peek()
            if not c:
                raise UnsupportedDockerfile(f'{self.where}: unterminated " quote')
            self.i += 1
            if c == '"':
                return "".join(out)
            if c == self.escape and self._peek() in ('"', self.escape, "$"):
                out.append(self._take_escaped())
            elif c == "$":
                out.append(self._variable())
            else:
                out.append(c)

    def _variable(self) -> str:
        if self._peek() == "{":
            self.i += 1
            m = _NAME.match(self.text, self.i)
            if not m:
                raise UnsupportedDockerfile(f"{self.where}: bad substitution in {self.text!r}")
            name = m.group(0)
            self.i = m.end()
            if self._peek() == "}":
                self.i += 1
                return self.scope.get(name, "")
            if self.text.startswith((":-", ":+"), self.i):
                mod = self.text[self.i : self.i + 2]
                self.i += 2
                alt = self._until(space_ends=False, stop="}")
                if self._peek() != "}":
                    raise UnsupportedDockerfile(f"{self.where}: missing }} in {self.text!r}")
                self.i += 1
                value = self.scope.get(name, "")
                if mod == ":-":
                    return value or alt
                return alt if value else ""
            raise UnsupportedDockerfile(
                f"{self.where}: unsupported substitution {self.text[self.i - len(name) - 2 :]!r}"
                " (supported: $VAR, ${VAR}, ${VAR:-default}, ${VAR:+alt})"
            )
        m = _NAME.match(self.text, self.i)
        if not m:
            return "$"
        self.i = m.end()
        return self.scope.get(m.group(0), "")


# -- instruction arguments ---------------------------------------------------------------------


def _arg_decls(rest: str, scope: Mapping[str, str], where: str, escape: str = "\\"):
    for word in expand_words(rest, scope, where, escape):
        name, eq, default = word.partition("=")
        if not _NAME.fullmatch(name):
            raise UnsupportedDockerfile(f"{where}: ARG {word!r} is not NAME or NAME=default")
        yield name, (default if eq else None)


def _env_pairs(
    rest: str, scope: Mapping[str, str], where: str, escape: str
) -> list[tuple[str, str]]:
    first = rest.split(None, 1)[0] if rest.strip() else ""
    if first and "=" not in first:
        # legacy form: ENV NAME the value, spaces and all
        value = rest[len(first) :].strip()
        return [(first, expand_word(value, scope, where, escape))]
    pairs = []
    for word in expand_words(rest, scope, where, escape):
        name, eq, value = word.partition("=")
        if not eq or not _NAME.fullmatch(name):
            raise UnsupportedDockerfile(f"{where}: ENV {word!r} is not NAME=value")
        pairs.append((name, value))
    if not pairs:
        raise UnsupportedDockerfile(f"{where}: ENV sets nothing")
    return pairs


def _copy_step(ins: Instruction, scope: Mapping[str, str], where: str, escape: str) -> Step:
    rest = ins.rest
    flags: list[str] = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    if any(f.startswith("--from") for f in flags):
        raise UnsupportedDockerfile(f"{where}: {ins.op} --from needs a multi-stage build")
    if rest.startswith("["):
        words = [expand_word(w, scope, where, escape) for w in _json_list(rest, where, ins.op)]
    else:
        if _HEREDOC.search(rest):
            raise UnsupportedDockerfile(f"{where}: heredocs need a real image build")
        words = expand_words(rest, scope, where, escape)
    if len(words) < 2:
        raise UnsupportedDockerfile(f"{where}: {ins.op} needs a source and a destination")
    if ins.op == "ADD" and any(_URL.match(w) for w in words[:-1]):
        raise UnsupportedDockerfile(f"{where}: ADD of a URL needs a real image build")
    return Step("COPY", tuple(words), ins.line, add=ins.op == "ADD")
