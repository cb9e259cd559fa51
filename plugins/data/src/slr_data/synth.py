"""``slr data synth``: SWE-smith-style bugs, made by changing one function with ``ast``.

Every function in the repository's source (not its tests) is a site; each mutation kind
changes one node of it, and only that node's text (comments and layout elsewhere stay).
The repository's tests then run in the task image with the change (``TestProbe``): a
mutation that breaks some tests that passed before becomes a task, its broken tests are
FAIL_TO_PASS, the still-passing ones PASS_TO_PASS; one that breaks nothing is rejected
(no test covers that code). The bug goes into the image (``bug_patch``) and the oracle
reverts it.
"""

from __future__ import annotations

import ast
import difflib
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from slr.contracts import SandboxError
from slr.tasks import load_task
from slr_data.execute import TestProbe
from slr_data.harbor import git, write_task
from slr_data.mine import Outcome
from slr_data.records import Instance, is_test_path

_CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BIN_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
KINDS = ("compare", "arith", "constant", "condition", "bool-op")


@frozen(kw_only=True)
class Mutation:
    path: str
    function: str
    kind: str
    line: int
    original: str
    mutated: str
    column: int = 0

    @property
    def name(self) -> str:
        """``<module>-<function>-<kind>-l<line>``, plus ``c<column>`` past the first node of
        that kind on the line, so two mutations never share a task id. Underscores at the
        ends of names are dropped (``__init__`` is ``init``): image names may not put ``_``
        next to ``-``."""
        stem = self.path.rsplit("/", 1)[-1].removesuffix(".py").strip("_") or "module"
        function = self.function.strip("_") or "function"
        col = f"c{self.column}" if self.column else ""
        return f"{stem}-{function}-{self.kind}-l{self.line}{col}"


def _mutate(node: ast.AST, kind: str) -> ast.expr | None:
    if kind == "compare" and isinstance(node, ast.Compare) and type(node.ops[0]) in _CMP_SWAP:
        return ast.Compare(
            node.left, [_CMP_SWAP[type(node.ops[0])](), *node.ops[1:]], node.comparators
        )
    if kind == "arith" and isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
        return ast.BinOp(node.left, _BIN_SWAP[type(node.op)](), node.right)
    if kind == "constant" and isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + 1)
    if kind == "constant" and isinstance(node, ast.Constant) and type(node.value) is bool:
        return ast.Constant(not node.value)
    if kind == "bool-op" and isinstance(node, ast.BoolOp):
        return ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
    return None


def _conditions(fn: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(fn):
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            yield node.test


def _replace(source: str, node: Any, text: str) -> str:
    lines = source.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: node.lineno - 1]) + _byte_col(
        lines[node.lineno - 1], node.col_offset
    )  # type: ignore[attr-defined]
    end_line = node.end_lineno or node.lineno  # type: ignore[attr-defined]
    end = sum(len(x) for x in lines[: end_line - 1]) + _byte_col(
        lines[end_line - 1], node.end_col_offset or 0
    )  # type: ignore[attr-defined]
    return source[:start] + text + source[end:]


def _byte_col(line: str, col: int) -> int:
    """ast columns count UTF-8 bytes; the string index of that column."""
    return len(line.encode()[:col].decode(errors="ignore"))


def mutations(repo_files: dict[str, str]) -> Iterator[Mutation]:
    """Every single-node mutation of every function in ``repo_files`` (path -> source)."""
    for path, source in sorted(repo_files.items()):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            seen: set[tuple[str, int, int]] = set()
            first_col: dict[tuple[str, int], int] = {}
            sites: list[tuple[str, Any]] = [("condition", c) for c in _conditions(fn)]
            sites += [(k, n) for n in ast.walk(fn) for k in KINDS if k != "condition"]
            for kind, node in sites:
                if kind == "condition":
                    new: ast.expr | None = ast.UnaryOp(ast.Not(), node)  # type: ignore[arg-type]
                else:
                    new = _mutate(node, kind)
                key = (kind, getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
                if new is None or key in seen or not hasattr(node, "end_col_offset"):
                    continue
                seen.add(key)
                mutated = _replace(source, node, f"({ast.unparse(new)})")
                if mutated != source:
                    line, col = key[1], key[2]
                    first = first_col.setdefault((kind, line), col)
                    yield Mutation(
                        path=path,
                        function=fn.name,
                        kind=kind,
                        line=line,
                        original=source,
                        mutated=mutated,
                        column=0 if col == first else col + 1,
                    )


def unified_patch(path: str, before: str, after: str) -> str:
    diff = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(diff)


def statement(fail_to_pass: list[str]) -> str:
    tests = "\n".join(f"- `{t}`" for t in fail_to_pass[:20])
    more = f"\n- ... and {len(fail_to_pass) - 20} more" if len(fail_to_pass) > 20 else ""
    return (
        "Some of the repository's tests fail, although they passed before a recent change "
        f"to the source code:\n\n{tests}{more}\n\nFind the bug in the source and fix it."
    )


def source_files(repo: Path, commit: str) -> dict[str, str]:
    names = git(repo, "ls-tree", "-r", "--name-only", commit).splitlines()
    return {
        n: git(repo, "show", f"{commit}:{n}")
        for n in names
        if n.endswith(".py") and not is_test_path(n) and not n.startswith(("docs/", "setup.py"))
    }


async def synth(
    repo: Path,
    out: Path,
    backend: Any,
    *,
    name: str | None = None,
    rev: str = "HEAD",
    max_tasks: int = 20,
    max_tries: int = 200,
    seed: int = 0,
    base_image: str,
    add_pytest: bool = True,
    progress: Callable[[Outcome], None] = lambda o: None,
) -> list[Outcome]:
    repo = repo.resolve()
    name = name or repo.name
    commit = git(repo, "rev-parse", rev).strip()
    muts = list(mutations(source_files(repo, commit)))
    random.Random(seed).shuffle(muts)
    base = Instance(
        instance_id=f"{name}-synth-base",
        repo=name,
        base_commit=commit,
        problem_statement="(probe)",
        source="synth",
    )
    results: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="slr-synth-") as tmp:
        probe_task = load_task(
            write_task(base, Path(tmp), repo_dir=repo, base_image=base_image, add_pytest=add_pytest)
        )
        await backend.prepare(probe_task)
        async with TestProbe(backend, probe_task) as probe:
            baseline = await probe.run(reset=False)
            # Only tests in test files are graded: the verifier resets the graded files to
            # the image's commit, which for a doctest in a source module would undo the fix.
            passing = {
                t
                for t, s in baseline.items()
                if s == "passed" and is_test_path(t.split("::", 1)[0])
            }
            if not passing:
                raise SandboxError(f"{repo}: no test passes at {commit[:10]}; nothing to break")
            kept = 0
            for mut in muts[:max_tries]:
                if kept >= max_tasks:
                    break
                started = time.monotonic()
                tid = f"{name}-{mut.name}"
                try:
                    await probe.write(mut.path, mut.mutated, Path(tmp))
                    try:
                        now = await probe.run(reset=False)
                    finally:
                        await probe.write(mut.path, mut.original, Path(tmp))
                except SandboxError as exc:
                    results.append(
                        Outcome(
                            name=tid,
                            reason=f"could not run the tests: {str(exc)[:300]}",
                            seconds=time.monotonic() - started,
                        )
                    )
                    progress(results[-1])
                    continue
                f2p = sorted(t for t in passing if now.get(t) != "passed")
                p2p = sorted(t for t in passing if now.get(t) == "passed")
                if not f2p:
                    results.append(
                        Outcome(
                            name=tid,
                            reason="no test fails with this change",
                            seconds=time.monotonic() - started,
                        )
                    )
                    progress(results[-1])
                    continue
                inst = attrs.evolve(
                    base,
                    instance_id=tid,
                    bug_patch=unified_patch(mut.path, mut.original, mut.mutated),
                    fail_to_pass=tuple(f2p),
                    pass_to_pass=tuple(p2p),
                    problem_statement=statement(f2p),
                )
                folder = write_task(
                    inst,
                    out,
                    repo_dir=repo,
                    base_image=base_image,
                    add_pytest=add_pytest,
                    extra_metadata={
                        "mutation": mut.kind,
                        "function": mut.function,
                        "file": mut.path,
                    },
                )
                kept += 1
                results.append(
                    Outcome(
                        name=tid,
                        task=folder,
                        fail_to_pass=len(f2p),
                        pass_to_pass=len(p2p),
                        seconds=time.monotonic() - started,
                    )
                )
                progress(results[-1])
    return results
