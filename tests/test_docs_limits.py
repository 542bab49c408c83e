"""The README a newcomer reads in five minutes, and a layout that names every module.

README.md: at most 250 lines and 14 KB, no line over 120 characters, with how long `make run`
and `make test` take, the fast test loop, and the scorecard as a summary (the full table in
docs/scorecard.md). docs/layout.md: its tree's entry of each folder of src/moecache
(`src/moecache/<folder>/`) names every module of that folder by its file name (a package's
`__init__.py` may go unnamed), and names no file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PACKAGE = REPO / "src" / "moecache"
LIMITS = {"lines": 250, "bytes": 14 * 1024, "width": 120}


def test_the_readme_is_short():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= LIMITS["lines"], f"README.md: {len(lines)} lines"
    assert len(text.encode()) <= LIMITS["bytes"], f"README.md: {len(text.encode())} bytes"
    wide = [f"{i}: {len(line)}" for i, line in enumerate(lines, 1) if len(line) > LIMITS["width"]]
    assert not wide, f"README.md: lines over {LIMITS['width']} characters (line: width) {wide}"


def test_the_readme_says_how_long_and_names_the_fast_loop():
    text = README.read_text()
    for command in ("make run", "make test"):
        assert re.search(rf"`{command}` (about )?\d+ min", text), f"how long {command} takes"
    assert re.search(r'pytest (-n auto )?-m "not pipeline"', text), "the fast loop"
    # The scorecard: its summary here, the full table in docs/.
    assert "<!-- summary:claims -->" in text and "<!-- numbers:claims -->" not in text
    assert "(docs/scorecard.md)" in text


def tree() -> dict[str, str]:
    """docs/layout.md's tree: each entry's path (a line's first word) to its text."""
    text = (REPO / "docs/layout.md").read_text()
    block = re.search(r"^```\n(.*?)^```", text, re.MULTILINE | re.DOTALL)[1]
    entries: dict[str, str] = {}
    path = None
    for line in block.splitlines():
        if line[:1].strip():
            path, _, rest = line.partition(" ")
            entries[path] = rest
        elif path and line.strip():
            entries[path] += " " + line.strip()
    return entries


def folders() -> list[Path]:
    return sorted({p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts})


def entry_of(folder: Path) -> str:
    rel = folder.relative_to(PACKAGE).as_posix()
    return "src/moecache/" if rel == "." else f"src/moecache/{rel}/"


def test_the_layout_walk_finds_the_package():
    entries = tree()
    assert {"src/moecache/", "src/moecache/harness/", "src/moecache/cli/"} <= set(entries)
    assert len(folders()) > 10


@pytest.mark.parametrize("folder", folders(), ids=lambda f: entry_of(f))
def test_the_layout_names_every_module_of_each_folder(folder):
    entries = tree()
    entry = entry_of(folder)
    assert entry in entries, f"docs/layout.md: no entry {entry}"
    named = set(re.findall(r"\b(\w+\.py)\b", entries[entry]))
    modules = {p.name for p in folder.glob("*.py")}
    unnamed = sorted(modules - named - {"__init__.py"})
    assert not unnamed, f"docs/layout.md: {entry} does not name {', '.join(unnamed)}"
    stale = sorted(named - modules)
    assert not stale, f"docs/layout.md: {entry} names {', '.join(stale)}, not in {entry}"
