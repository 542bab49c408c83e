"""What a stage's results file ends with when the settings and machine that computed it are
known (moecache/provenance.py's stamp): the settings, their hash, the package versions, the
device and its name, and the input files by SHA-256 where it records them. `Stamped` keeps
them last in the file, in that order, as provenance.write_results appends them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.record import Record

SCHEMA = 1  # a stage's results file's version: a field added, removed or changed bumps it

STAMP = ("settings", "settings_hash", "versions", "device", "device_name", "inputs")


@dataclass(frozen=True, kw_only=True)
class Stamped(Record):
    """A stage's results, stamped; `leading`: stamp fields the report itself set first
    (the profile's device), which keep their place."""

    version: ClassVar[int] = SCHEMA
    leading: ClassVar[tuple[str, ...]] = ()

    settings: dict
    settings_hash: str
    versions: dict
    device: str
    device_name: str

    def as_dict(self) -> dict:
        found = super().as_dict()

        def place(key: str) -> int:  # the schema first, the stamp last
            if key == "schema":
                return -1
            return STAMP.index(key) + 1 if key in STAMP and key not in self.leading else 0

        return {key: found[key] for key in sorted(found, key=place)}
