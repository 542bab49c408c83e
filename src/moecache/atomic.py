"""Write outputs so that a failed job leaves nothing behind: write beside, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _publish(tmp: Path, path: Path, mode: int) -> None:
    """Give the temporary output ordinary permissions (mkstemp makes it private), then rename."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, mode & ~umask)
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        _publish(tmp, path, 0o666)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder; it replaces `path` whole on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        _publish(tmp, path, 0o777)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, report: dict) -> None:
    write_text(path, json.dumps(report, indent=1, default=float) + "\n")


def read_json(path: str | Path, what: str = "a results file") -> dict:
    """A results file, or one line saying why it cannot be read."""
    from moecache.errors import MoecacheError

    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise MoecacheError(f"{path}: not {what} ({error})") from None
