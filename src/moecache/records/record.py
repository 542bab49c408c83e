"""What the records read and written whole by records/io.py share (the replay stage's
files, the harness's batched runs): the file's dict in the fields' order, leaving out an
`optional` field the file did not hold (None); what the file is, for RecordError's line;
the schema version this moecache reads."""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar, TypeVar


class Record:
    what: ClassVar[str]
    version: ClassVar[int]
    optional: ClassVar[tuple[str, ...]] = ()

    def as_dict(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.name in self.optional and getattr(self, f.name) is None)
        }


R = TypeVar("R", bound=Record)
