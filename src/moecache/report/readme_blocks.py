"""The marked number blocks of Markdown files: `<!-- numbers:NAME -->` ... `<!--
/numbers:NAME -->`. `moecache numbers` writes every section between such markers, and
`make publish` refreshes the blocks of the same names in the README and in docs/*.md:
each block may live in any one of those files, and every section must have a block."""

from __future__ import annotations

import re
from pathlib import Path

from moecache.atomic import write_text
from moecache.errors import MoecacheError

MARKER = re.compile(r"<!-- (/?)numbers:([A-Za-z0-9_-]+) -->")
BLOCK = re.compile(r"<!-- numbers:([A-Za-z0-9_-]+) -->.*?<!-- /numbers:\1 -->", flags=re.DOTALL)


def block(name: str, body: str) -> str:
    body = body.strip("\n")
    inner = f"\n\n{body}\n\n" if body else "\n"
    return f"<!-- numbers:{name} -->{inner}<!-- /numbers:{name} -->"


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


def refresh(files, sections: dict[str, str], source: str) -> dict[Path, str]:
    """Replace each marked block's body in `files` (one path or several) by the section of
    the same name; write the files whose text changed, or none when the sets differ."""
    files = [Path(files)] if isinstance(files, (str, Path)) else [Path(p) for p in files]
    texts = placed(files, sections, source)
    new = {
        path: BLOCK.sub(lambda m: block(m.group(1), sections[m.group(1)]), text)
        for path, text in texts.items()
    }
    for path, text in new.items():
        if text != texts[path]:
            write_text(path, text)
    return new
