"""How the numbers are written: significant digits, thousands separated, no negative zero,
Markdown tables; and how results files are read (one clear line when one is missing)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from moecache.errors import MoecacheError


def _clean(text: str) -> str:
    """No negative zero: '-0', '-0.00' and '-0.0%' read as zero."""
    if text.startswith("-") and not re.search(r"[1-9]", text):
        return text[1:]
    return text


def sig(x: float | None, digits: int = 3) -> str:
    """`x` to `digits` significant digits, never in exponent form; thousands separated."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return _clean(f"{x:,.{decimals}f}")


def fixed(x: float | None, decimals: int) -> str:
    if x is None:
        return "n/a"
    return _clean(f"{x:,.{decimals}f}")


def count(n) -> str:
    return f"{int(n):,}"


def percent(share: float | None, decimals: int = 1) -> str:
    return "n/a" if share is None else _clean(f"{100 * share:.{decimals}f}%")


def small(x: float) -> str:
    """A difference that should be zero: two significant digits in exponent form."""
    return "0" if x == 0 else f"{x:.1e}"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def yes(flag) -> str:
    return "yes" if flag else "no"


def cell(value) -> str:
    """A CSV cell as written: integers without decimals, others to four significant
    digits, a missing value blank."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return _clean(f"{value:.4g}")
    return str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def read(path: Path, what: str = "a results file") -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MoecacheError(f"{path}: missing (run the pipeline first)") from None
    except (OSError, json.JSONDecodeError) as error:
        raise MoecacheError(f"{path}: not {what} ({error})") from None


def benchmark_seconds(path: Path) -> float:
    """A Snakemake benchmark's wall-clock seconds (the mean over its repeats)."""
    return benchmark_times(path)[0]


def benchmark_times(path: Path) -> tuple[float, float]:
    """A Snakemake benchmark's (wall-clock seconds, CPU seconds), the means over its repeats."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, sep="\t")
        return float(frame["s"].mean()), float(frame["cpu_time"].mean())
    except (OSError, KeyError, ValueError, pd.errors.ParserError) as error:
        raise MoecacheError(f"{path}: not a Snakemake benchmark ({error})") from None


def shards_of(workdir: Path, shards: Sequence[str] | None) -> list[str]:
    """The held-out shards, in the config's order when given, else the gates files'."""
    if shards:
        return list(shards)
    found = sorted(path.stem for path in (workdir / "results/gates").glob("*.json"))
    if not found:
        raise MoecacheError(f"{workdir / 'results/gates'}: no gates files (run the pipeline)")
    return found
