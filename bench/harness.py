"""What the benchmarks in bench/ share: their command line, output, clock and memory figures.

The house rule for a bench: it prints a table, and with ``--json`` one JSON object; its
figures are ratios measured side by side in one run. ``parser`` gives every bench the same
``--json``, and ``Output`` keeps the promise it makes:

- ``--json`` (a flag): stdout is one JSON object and nothing else, so ``json.loads`` of it
  works; the table and the notes go to stderr, where a person still sees them;
- ``--json PATH`` (the long benches, whose result is kept: ``parser(..., json_path=True)``):
  the table and one JSON line on stdout, and the object, indented, written to PATH;
- neither: the table on stdout.

Standard library only: ``bench/gpu/torch_only.py`` imports this module on a lent GPU machine
where torch is all that is installed (bench/gpu/README.md), so the table is plain text.
Run as ``python bench/x.py``, a bench finds this module beside it (``sys.path[0]``); a test
that loads a bench with importlib puts ``bench/`` on ``sys.path`` first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

#: A column of ``table``: its header, or its header and how to write its cells (a format
#: spec such as ``".2f"``, or a function of the value). A spec starting with ``<`` or ``>``
#: also sets the alignment; otherwise numbers are right-aligned and text left. A cell that
#: is text already is written as it is.
Column = str | tuple[str, str | Callable[[Any], str]]


# -- the command line ----------------------------------------------------------------------


def parser(
    doc: str | None, *, json_path: bool = False, whole_doc: bool = False
) -> argparse.ArgumentParser:
    """An argument parser with the bench's ``--json``; its description is ``doc``'s first
    paragraph (the module docstring), or all of it with ``whole_doc``.

    ``--json`` is a flag (``args.json``); with ``json_path`` it is ``--json PATH``
    (``args.json_path``), for the benches that keep their result in a file.
    """
    text = (doc or "").strip()
    p = argparse.ArgumentParser(
        description=text if whole_doc else text.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if json_path:
        p.add_argument(
            "--json",
            dest="json_path",
            type=Path,
            default=None,
            metavar="PATH",
            help="also write the JSON object to PATH (the table and one JSON line are printed)",
        )
    else:
        p.add_argument(
            "--json",
            action="store_true",
            help="print one JSON object on stdout, and nothing else there (the table goes to "
            "stderr)",
        )
    return p


# -- the output ----------------------------------------------------------------------------


class Output:
    """Where a bench's table, notes and JSON object go, by its ``--json`` (module docstring).

    ``Output()`` without arguments (a bench's function called from a test) prints the
    table and notes on stdout and no JSON.
    """

    def __init__(
        self, args: argparse.Namespace | None = None, *, stdout: TextIO | None = None
    ) -> None:
        """``stdout``: where the result goes instead of ``sys.stdout``, for a bench whose
        libraries print on file descriptor 1 (it keeps a duplicate of it, then points 1 at 2).
        """
        self.stdout = stdout
        self.json = getattr(args, "json", False) is True
        #: a ``--json PATH`` bench: it prints its JSON line with or without PATH
        self.keeps = args is not None and hasattr(args, "json_path")
        self.json_path: Path | None = getattr(args, "json_path", None)

    @property
    def file(self) -> TextIO:
        """The human-readable stream: stderr when stdout is the JSON object's."""
        return sys.stderr if self.json else self.stdout or sys.stdout

    def print(self, *parts: object, end: str = "\n") -> None:
        print(*parts, end=end, file=self.file, flush=True)

    def progress(self, *parts: object) -> None:
        """A note while the bench runs (a row of a mode that took minutes): always on
        stderr, so that stdout holds the result alone."""
        print(*parts, file=sys.stderr, flush=True)

    def table(
        self, columns: Sequence[Column], rows: Iterable[Sequence[object]], *, title: str = ""
    ) -> None:
        self.print(table(columns, rows, title=title))

    def result(
        self, obj: Mapping[str, Any], *, default: Callable[[Any], Any] | None = None
    ) -> None:
        """The bench's one JSON object (``default`` as in ``json.dumps``)."""
        if self.json or self.keeps:
            print(json.dumps(obj, default=default), file=self.stdout or sys.stdout, flush=True)
        if self.json_path is not None:
            Path(self.json_path).write_text(json.dumps(obj, indent=2, default=default) + "\n")


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]], *, title: str = "") -> str:
    """``rows`` under the ``columns``' headers, each column as wide as its widest cell, two
    spaces apart; ``None`` is written ``-``. ``title`` goes above."""
    heads = [c if isinstance(c, str) else c[0] for c in columns]
    specs = [None if isinstance(c, str) else c[1] for c in columns]
    rows = [list(r) for r in rows]
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"a row of {len(r)} cells under {len(columns)} columns: {r!r}")
    cells = [[_cell(v, specs[i]) for i, v in enumerate(r)] for r in rows]
    right = []
    for i, spec in enumerate(specs):
        if isinstance(spec, str) and spec and spec[0] in "<>":
            right.append(spec[0] == ">")
        else:
            values = [r[i] for r in rows if r[i] is not None]
            right.append(all(_is_number(v) for v in values) if values else True)
    widths = [max([len(heads[i])] + [len(r[i]) for r in cells]) for i in range(len(columns))]

    def line(texts: list[str]) -> str:
        padded = [
            t.rjust(w) if r else t.ljust(w) for t, w, r in zip(texts, widths, right, strict=True)
        ]
        return "  ".join(padded).rstrip()

    out = [title] if title else []
    out.append(line(heads))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object, spec: str | Callable[[Any], str] | None) -> str:
    if value is None:
        return "-"
    if spec is None or isinstance(value, str):  # text is written as it is
        return str(value)
    if callable(spec):
        return spec(value)
    return format(value, spec.lstrip("<>"))


def ratio(value: float) -> str:
    """A ratio as a table cell: ``1.84x``."""
    return f"{value:.2f}x"


# -- the clock -----------------------------------------------------------------------------


def timed(fn: Callable[[], T], *, sync: Callable[[], object] | None = None) -> tuple[T, float]:
    """``fn()``'s result and its wall time in seconds. ``sync`` (``torch.cuda.synchronize``)
    runs before the clock starts and before it stops, so the time includes the device work
    that ``fn`` queued, and none queued before it."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    return out, time.perf_counter() - t0


def median_timed(
    fn: Callable[[], T],
    *,
    repeats: int,
    warmup: int = 0,
    sync: Callable[[], object] | None = None,
) -> tuple[T, float]:
    """``fn()`` ``repeats`` times after ``warmup`` untimed calls (first calls pay one-off
    allocations): the last result, and the median wall time in seconds (``sync`` as in
    ``timed``)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: time at least one call")
    for _ in range(warmup):
        fn()
    runs = [timed(fn, sync=sync) for _ in range(repeats)]
    return runs[-1][0], statistics.median(s for _, s in runs)


# -- memory --------------------------------------------------------------------------------


def rss_mb(pid: int | str = "self", *, peak: bool = False) -> float:
    """A process's resident memory in MiB (``VmRSS`` of /proc/PID/status), or its peak
    (``VmHWM``) with ``peak``; 0.0 for a process that is gone (a bench summing a process
    tree races its exits)."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0  # a zombie has no memory lines


def reset_peak_rss() -> float:
    """Reset this process's peak resident memory to its current one (Linux's ``clear_refs``
    5), so ``rss_mb(peak=True)`` afterwards is the peak of what follows; the current MiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_mb()
