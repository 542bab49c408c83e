"""A table's data and its written form: CSV per part (full precision), Markdown with its
caption, notes and verdicts, and `<name>.sources.json` (the input files with their SHA-256,
the config hashes and devices they record, the package versions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from moecache import provenance
from moecache.atomic import atomic_file, write_json, write_text


@dataclass
class Table:
    name: str
    title: str
    caption: str
    parts: dict[str, pd.DataFrame] = field(default_factory=dict)  # "" is the main part
    sources: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # context lines after the tables
    part_captions: dict[str, str] = field(default_factory=dict)  # a part's own caption
    # What the table finds, one sentence each, by heading ("": none). Kept apart from the
    # notes so that the numbers and the README quote them without parsing the prose.
    verdicts: dict[str, list[str]] = field(default_factory=dict)

    def verdict_lines(self) -> list[str]:
        return [line for group in self.verdicts.values() for line in group]

    def closing_lines(self) -> list[str]:
        """The Markdown lines after the tables: the notes, then each group of verdicts
        after a blank line and its heading."""
        lines = list(self.notes)
        for heading, group in self.verdicts.items():
            if lines:
                lines.append("")
            lines += [heading] if heading else []
            lines += group
        return lines


def not_produced(name: str, title: str, what: str, columns: list[str]) -> Table:
    """A table whose inputs this run's config does not make (no accuracy section, one
    shard, ...): no rows, and a caption that says why."""
    return Table(
        name,
        title,
        f"Not produced by this run: {what}, so the table has no rows.",
        {"": pd.DataFrame(columns=columns)},
    )


def write(table: Table, out_dir) -> None:
    out_dir = Path(out_dir)
    source = provenance.sources(table.sources)
    lines = [f"### {table.title}", "", table.caption, ""]
    for part, frame in table.parts.items():
        stem = f"{table.name}_{part}" if part else table.name
        with atomic_file(out_dir / f"{stem}.csv") as tmp:
            frame.to_csv(tmp, index=False)
        if part:
            lines += [f"**{part.replace('_', ' ')}**", ""]
        if part in table.part_captions:
            lines += [table.part_captions[part], ""]
        if len(frame):
            lines += [frame.to_markdown(index=False, floatfmt=".4g"), ""]
        else:
            lines += ["(no rows)", ""]
    closing = table.closing_lines()
    lines += closing + ([""] if closing else [])
    lines.append(
        f"Config hash {', '.join(source['config_hashes']) or 'n/a'}; device "
        f"{', '.join(source['devices']) or 'n/a'}; moecache {source['versions']['moecache']}; "
        f"sources in `{table.name}.sources.json`."
    )
    write_text(out_dir / f"{table.name}.md", "\n".join(lines) + "\n")
    write_json(out_dir / f"{table.name}.sources.json", source)
