"""What a routing log is stored in, told by its first bytes rather than its name: logs are
kept gzip'd or zstd'd, and a file of another kind given to a JSON-lines importer must be
one line naming what it looks like, not a UnicodeDecodeError traceback.

`json_lines` reads plain, gzip and zstd JSON lines a line at a time (zstd through
pyarrow's codec, a dependency already: no module of its own).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moecache.errors import MoecacheError
from moecache.records.demand import json_objects

MAGIC = (  # (first bytes, what the file looks like)
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"PAR1", "parquet"),
    (b"\x93NUMPY", "npy"),
    (b"\x80", "pickle"),
)
LOOKS = {
    "zip": "a zip archive (a NumPy .npz or a torch .pt: --from numpy or --from sglang)",
    "parquet": "a Parquet file (moe-policylang's: --from policylang; a trace: no convert)",
    "npy": "a NumPy .npy array (--from numpy)",
    "pickle": "a pickle (a legacy torch .pt; re-save it with torch.save)",
}


def kind(path) -> str:
    """The file's kind by its magic bytes: one of MAGIC's, "empty", or "text"."""
    path = Path(path)
    if not path.is_file():
        raise MoecacheError(f"{path}: no such file")
    with open(path, "rb") as stream:
        head = stream.read(8)
    if not head:
        return "empty"
    return next((name for magic, name in MAGIC if head.startswith(magic)), "text")


def zstd_reader(path):
    """A buffered, line-iterable reader of a zstd file, decompressed by pyarrow's codec
    (imported here: only a zstd log pays for it)."""
    import pyarrow as pa

    return io.BufferedReader(pa.input_stream(str(path), compression="zstd"))


@contextmanager
def opened(path):
    """The file's bytes, decompressed where it is gzip or zstd; any other binary kind is
    one line naming what it looks like."""
    found = kind(path)
    if found in LOOKS:
        raise MoecacheError(f"{path}: {LOOKS[found]}, not JSON lines")
    with open(path, "rb") as raw:
        if found == "gzip":
            with gzip.open(raw, "rb") as stream:
                yield stream
        elif found == "zstd":
            with zstd_reader(path) as stream:
                yield stream
        else:
            yield raw


def lines(path) -> Iterator[tuple[int, str]]:
    """(number, text) per line; damage and bytes that are not UTF-8 are one line."""
    with opened(path) as stream:
        number = 0
        try:
            for number, raw in enumerate(stream, start=1):
                try:
                    yield number, raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise MoecacheError(
                        f"{path}:{number}: not UTF-8 text (byte {raw[error.start]:#04x} at "
                        f"column {error.start + 1}; a binary file?)"
                    ) from None
        except (EOFError, OSError, zlib.error) as error:
            raise MoecacheError(
                f"{path}: compressed data truncated or damaged after {number} lines ({error})"
            ) from None


def json_lines(path) -> Iterator[tuple[str, dict]]:
    """(where, object) per non-blank line; `where` is path:line."""
    return json_objects(path, lines(path))
