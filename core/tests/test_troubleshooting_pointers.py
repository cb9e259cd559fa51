"""Every pointer from `slr`'s messages to a troubleshooting page resolves: the page exists
and so does the heading its anchor names; and every link between those pages resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = [
    p
    for group in ("core", "cli", "plugins/*", "adapters/*", "sandbox_backends/*", "loggers/*")
    for src in ROOT.glob(f"{group}/src")
    for p in src.rglob("*.py")
]
POINTER = re.compile(r"docs/troubleshooting/[\w./-]+\.md(?:#[\w-]+)?")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", page.read_text(), re.MULTILINE)}


def resolves(target: Path, anchor: str) -> str | None:
    """None when ``target`` (and ``#anchor``) exists, else what is missing."""
    if not target.is_file():
        return f"no page {target.relative_to(ROOT)}"
    if anchor and anchor not in anchors(target):
        return f"no heading #{anchor} in {target.relative_to(ROOT)}"
    return None


def pointers() -> list[tuple[str, str]]:
    found = []
    for path in SOURCES:
        for match in POINTER.finditer(path.read_text()):
            found.append((str(path.relative_to(ROOT)), match.group(0)))
    return found


def test_messages_point_at_troubleshooting_pages():
    # the preflight's checks and the CLI's start-up errors carry pointers
    assert len({p for _, p in pointers()}) >= 8


@pytest.mark.parametrize(("source", "pointer"), pointers())
def test_each_pointer_resolves(source, pointer):
    page, _, anchor = pointer.partition("#")
    problem = resolves(ROOT / page, anchor)
    assert problem is None, f"{source} points at {pointer}: {problem}"


@pytest.mark.parametrize(
    "page",
    [*sorted((DOCS / "troubleshooting").glob("*.md")), DOCS / "operations.md"],
    ids=lambda p: p.name,
)
def test_links_between_pages_resolve(page):
    for link in LINK.findall(page.read_text()):
        if "://" in link:
            continue
        target, _, anchor = link.partition("#")
        problem = resolves((page.parent / target).resolve() if target else page, anchor)
        assert problem is None, f"{page.relative_to(ROOT)} links {link}: {problem}"


def test_every_troubleshooting_page_is_in_the_index():
    index = (DOCS / "troubleshooting" / "README.md").read_text()
    for page in (DOCS / "troubleshooting").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name}" in index, f"list {page.name} in troubleshooting/README.md"
