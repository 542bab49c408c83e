"""The reproduction scorecard: one row per quantitative claim of the paper, in the paper's
order, each answered from a run's results files at the matching setting (claim_checks/).

A row is data: the claim, where the paper makes it, the paper's value, this run's, the
setting it was read at (capacity, multiplier, threshold), the tolerance and the verdict
(`holds`, `differs`, `undecided` where its own check finds the evidence too small to
decide it, with why and the size that would, `not comparable` with why, or `not run`
where an input is missing), with the files it came from. The claims themselves are in
paper_claims.py, a differing row's likely causes in claim_causes.py. Rendering (claims.md,
the README's block) comes afterwards and reads only these fields.
"""

from __future__ import annotations

from pathlib import Path

from moecache.errors import MoecacheError
from moecache.report.claim_causes import causes
from moecache.report.evidence import (
    DIFFERS,
    HOLDS,
    NOT_COMPARABLE,
    NOT_RUN,
    UNDECIDED,
    VERDICTS,
    Found,
    Missing,
    Results,
)
from moecache.report.paper_claims import CLAIMS, Claim

# ------------------------------------------------------------------------ the scorecard

COLUMNS = [
    "key",
    "claim",
    "where",
    "paper",
    "this_run",
    "setting",
    "other_capacities",
    "tolerance",
    "verdict",
    "why",
    "sources",
]


def row(claim: Claim, results: Results, because: dict[str, str] | None = None) -> dict:
    try:
        found = claim.answer(results)
    except Missing as missing:
        found = Found("not run", NOT_RUN, why=str(missing))
    except (KeyError, IndexError, TypeError) as error:
        raise MoecacheError(
            f"claim {claim.key}: a results file lacks or mistypes {error} (written by an "
            "older moecache? rerun its rule)"
        ) from None
    why = found.why
    cause = (because or {}).get(claim.key)
    if found.verdict == DIFFERS and cause:
        why = "; ".join(filter(None, [why, f"stated, not tested: {cause}"]))
    return {
        "key": claim.key,
        "claim": claim.claim,
        "where": claim.where,
        "paper": claim.paper,
        "this_run": found.value,
        "setting": found.setting,
        "other_capacities": "; ".join(found.elsewhere),
        "tolerance": claim.tolerance,
        "verdict": found.verdict,
        "why": why,
        "sources": " ".join(found.sources),
    }


def scorecard(workdir, shards=None) -> list[dict]:
    """Every claim's row, from whatever results exist under `workdir`."""
    if not Path(workdir, "results").is_dir():
        raise MoecacheError(f"{workdir}: no results/ folder (run the pipeline there first)")
    results = Results(workdir, shards)
    because = causes(results.settings(), results)
    return [row(claim, results, because) for claim in CLAIMS]


# ------------------------------------------------------------------------ rendering

HEADER = [
    "claim",
    "where",
    "paper",
    "this run",
    "setting",
    "at other capacities",
    "tolerance",
    "verdict",
    "from",
]


def shown_sources(sources: str) -> str:
    """A row's files, folded to their folder when there are more than two."""
    files = sources.split()
    if len(files) <= 2:
        return ", ".join(f"`{f}`" for f in files)
    folders = sorted({str(Path(f).parent) for f in files})
    return ", ".join(f"`{d}/`" for d in folders) + f" ({len(files)} files)"


# Verdicts whose why says why the claim was not judged: it follows a colon.
EXPLAINED = (UNDECIDED, NOT_COMPARABLE, NOT_RUN)


def markdown_table(rows: list[dict]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    for r in rows:
        # Why a claim could not be judged follows a colon; a note on a judged one, brackets.
        note = r["why"] and (f": {r['why']}" if r["verdict"] in EXPLAINED else f" ({r['why']})")
        said = r["verdict"] + note
        cells = [
            r["claim"],
            r["where"],
            r["paper"],
            r["this_run"],
            r["setting"],
            r["other_capacities"],
            r["tolerance"],
            f"**{said}**" if r["verdict"] == HOLDS else said,
            shown_sources(r["sources"]),
        ]
        lines.append("| " + " | ".join(map(cell, cells)) + " |")
    return "\n".join(lines)


def tally(rows: list[dict]) -> str:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return f"{len(rows)} claims: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + "."


def render(rows: list[dict]) -> str:
    """The scorecard as the README's block and claims.md show it."""
    return f"{markdown_table(rows)}\n\n{tally(rows)}"


CAPTION = (
    "One row per quantitative claim of the paper, in the paper's order: where the paper "
    "makes it, its value, this run's value at the matching setting (replay claims at the "
    "paper's ratio C = N/2 where `replay.capacities` has it), the tolerance the verdict "
    "uses and the verdict. `undecided` says why the run's own evidence cannot decide the "
    "claim (a tuned router that did not learn, a controller still learning, answers at "
    "chance, an interval across the tolerance) and what size would; `not comparable` says "
    "why (a tiny model's NLL scale, a capacity or multiplier this run lacks); `not run`: "
    "this run has no results for it. Every value "
    "is read from the files named in the last column (`claims.csv` lists each file)."
)


def read_rows(path) -> list[dict]:
    """The rows of a claims.csv (the README's block renders them as claims.md does)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise MoecacheError(f"{path}: missing (run `moecache claims` first)") from None
    lacking = [c for c in COLUMNS if c not in frame.columns]
    if lacking:
        raise MoecacheError(f"{path}: not a scorecard (no column {lacking[0]})")
    return frame.to_dict("records")


def write(rows: list[dict], out_dir, workdir=".") -> None:
    """claims.csv, claims.md and claims.sources.json under `out_dir`, each written whole."""
    import pandas as pd

    from moecache import provenance
    from moecache.atomic import atomic_file, write_json, write_text

    out_dir = Path(out_dir)
    with atomic_file(out_dir / "claims.csv") as tmp:
        pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp, index=False)
    text = f"### Reproduction scorecard\n\n{CAPTION}\n\n{render(rows)}\n"
    write_text(out_dir / "claims.md", text)
    used = sorted({f for r in rows for f in r["sources"].split()})
    write_json(
        out_dir / "claims.sources.json", provenance.sources([Path(workdir) / f for f in used])
    )
