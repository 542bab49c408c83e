"""The marked number blocks of Markdown files: `<!-- numbers:NAME -->` ... `<!--
/numbers:NAME -->`. `moecache numbers` writes every section between such markers, and
`make publish` refreshes the blocks of the same names in the README and in docs/*.md:
each block may live in any one of those files, and every section must have a block.

A `<!-- summary:claims -->` ... `<!-- /summary:claims -->` block (the README's) is the
scorecard's summary: per claim its verdict, the paper's value and this run's (and, where it
is undecided, the first clause of why), rendered from the scorecard's claims.csv (the
`claims` block, in docs/, holds the full table)."""

from __future__ import annotations

import re
from pathlib import Path

from moecache.atomic import write_text
from moecache.errors import MoecacheError

MARKER = re.compile(r"<!-- (/?)numbers:([A-Za-z0-9_-]+) -->")
BLOCK = re.compile(r"<!-- numbers:([A-Za-z0-9_-]+) -->.*?<!-- /numbers:\1 -->", flags=re.DOTALL)
SUMMARY = re.compile(r"<!-- summary:claims -->.*?<!-- /summary:claims -->", flags=re.DOTALL)
SUMMARY_WIDTH = 100  # the summary's lines, wrapped as Markdown list items
# A word Markdown would read as a new block at the start of a line (a quote, a heading, a
# table row, a list item): never the first of a continuation line.
BLOCK_START = re.compile(r"[>#|]|[-+*]$|\d+[.)]$")


def block(name: str, body: str, kind: str = "numbers") -> str:
    body = body.strip("\n")
    inner = f"\n\n{body}\n\n" if body else "\n"
    return f"<!-- {kind}:{name} -->{inner}<!-- /{kind}:{name} -->"


def claims_summary(path: str | Path) -> str:
    """The scorecard's summary from its claims.csv: one list item per claim, in the
    paper's order (verdict, claim, the paper's value, this run's), then the tally."""
    from moecache.report import claims

    rows = claims.read_rows(path)
    items = []
    for r in rows:
        verdict = f"**{r['verdict']}**" if r["verdict"] == claims.HOLDS else r["verdict"]
        item = f"- {verdict}: {r['claim']}. Paper: {r['paper']}. This run: {r['this_run']}."
        if r["verdict"] == claims.UNDECIDED:  # the reader needs why; the sizes are in docs/
            item += f" Why: {first_clause(r['why'])}."
        items.append(wrapped(item))
    return "\n".join(items) + f"\n\n{claims.tally(rows)}"


def first_clause(why: str) -> str:
    """A reason's first clause, before its numbers (the README has room for no more; the
    full reason, with the size that would decide, is in claims.md)."""
    return re.split(r" \(|: |; ", why, maxsplit=1)[0]


def wrapped(item: str, width: int = SUMMARY_WIDTH) -> str:
    """A Markdown list item in lines of at most `width` characters where its words allow,
    continued two spaces in, no continuation line starting a new Markdown block."""
    lines = [[]]
    for word in item.split():
        line = lines[-1]
        if line and len(" ".join([*line, word])) > width - 2 * (len(lines) > 1):
            moved = [word]
            while BLOCK_START.match(moved[0]) and len(line) > 1:
                moved.insert(0, line.pop())
            lines.append(moved)
        else:
            line.append(word)
    return "\n  ".join(" ".join(line) for line in lines)


def blocks(text: str, where: str) -> dict[str, str]:
    """The marked blocks of a Markdown text, name to body; one line naming the problem when
    a marker is unpaired, nested or repeated."""
    found: dict[str, str] = {}
    open_name, open_end = None, 0
    for match in MARKER.finditer(text):
        closing, name = match.group(1) == "/", match.group(2)
        if not closing:
            if open_name is not None:
                raise MoecacheError(
                    f"{where}: block numbers:{name} opens inside numbers:{open_name}"
                )
            if name in found:
                raise MoecacheError(f"{where}: block numbers:{name} appears twice")
            open_name, open_end = name, match.end()
        else:
            if open_name != name:
                raise MoecacheError(
                    f"{where}: closing marker of numbers:{name} without its opening marker"
                )
            found[name] = text[open_end : match.start()].strip("\n")
            open_name = None
    if open_name is not None:
        raise MoecacheError(f"{where}: block numbers:{open_name} is never closed")
    return found


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as error:
        raise MoecacheError(f"{path}: cannot be read ({error})") from None


def read_sections(path: str | Path) -> dict[str, str]:
    """The blocks of a file written by `moecache numbers --out`."""
    sections = blocks(read_text(path), str(path))
    if not sections:
        raise MoecacheError(f"{path}: no <!-- numbers:NAME --> blocks")
    return sections


def placed(files: list[Path], sections: dict[str, str], source: str) -> dict[Path, str]:
    """Each file's text; refuses in one line when a file has a block that `sections` lacks,
    when two files hold the same block, or when a section has no block in any file."""
    texts, where = {}, {}
    for path in files:
        texts[path] = read_text(path)
        for name in blocks(texts[path], str(path)):
            if name not in sections:
                raise MoecacheError(f"{path} has block {name} that {source} lacks")
            if name in where:
                raise MoecacheError(f"block numbers:{name} is in both {where[name]} and {path}")
            where[name] = path
    unplaced = [name for name in sections if name not in where]
    if unplaced:
        names = ", ".join(str(path) for path in files)
        raise MoecacheError(f"{source} has section(s) {', '.join(unplaced)} that {names} lack")
    return texts


def refresh(
    files, sections: dict[str, str], source: str, claims: str | Path | None = None
) -> dict[Path, str]:
    """Replace each marked block's body in `files` (one path or several) by the section of
    the same name, and a summary:claims block's by the summary of `claims` (the claims.csv
    beside the sections); write the files whose text changed, or none when the sets differ
    or a summary block has no claims.csv to read."""
    files = [Path(files)] if isinstance(files, (str, Path)) else [Path(p) for p in files]
    texts = placed(files, sections, source)
    summarized = [path for path, text in texts.items() if SUMMARY.search(text)]
    summary = ""
    if summarized:
        if claims is None:
            raise MoecacheError(f"{summarized[0]}: block summary:claims needs a claims.csv")
        summary = block("claims", claims_summary(claims), "summary")
    new = {
        path: SUMMARY.sub(
            lambda _: summary,
            BLOCK.sub(lambda m: block(m.group(1), sections[m.group(1)]), text),
        )
        for path, text in texts.items()
    }
    for path, text in new.items():
        if text != texts[path]:
            write_text(path, text)
    return new
