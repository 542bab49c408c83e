"""The reproduction scorecard: one row per quantitative claim of the paper, in the paper's
order, each answered from a run's results files at the matching setting (claim_checks/).

A row is data: the claim, where the paper makes it, the paper's value, this run's, the
setting it was read at (capacity, multiplier, threshold), the tolerance and the verdict
(`holds`, `differs`, `undecided` where its own check finds the evidence too small to
decide it, with why and the size that would, `not comparable` with why, or `not run`
where an input is missing), with the files it came from. Rendering (claims.md, the
README's block) comes afterwards and reads only these fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moecache.errors import MoecacheError
from moecache.records.io import read_run
from moecache.report.claim_checks import (
    controller as controller_checks,
)
from moecache.report.claim_checks import (
    dwell as dwell_checks,
)
from moecache.report.claim_checks import (
    learned as learned_checks,
)
from moecache.report.claim_checks import (
    replay as replay_checks,
)
from moecache.report.claim_checks import (
    router as router_checks,
)
from moecache.report.claim_checks import (
    table2 as table2_checks,
)
from moecache.report.evidence import (
    DIFFERS,
    HOLDS,
    NOT_COMPARABLE,
    NOT_RUN,
    PAPER_MODEL,
    UNDECIDED,
    VERDICTS,
    Found,
    Missing,
    Results,
    runs_1x,
)

# ------------------------------------------------------------------------ the scorecard


@dataclass(frozen=True)
class Claim:
    key: str
    claim: str
    where: str
    paper: str
    tolerance: str
    answer: Callable[[Results], Found]


# In the paper's order (first mention). Tolerances are the verdicts' own thresholds.
CLAIMS = [
    Claim(
        "restrict_cost",
        "every restricting policy faster than LRU loses >= 0.067 nats",
        "Abstract; §3.1, Fig. 1",
        "+0.067 (Dwell-16)",
        "least loss >= 0.067",
        replay_checks.restrict_cost,
    ),
    Claim(
        "ff_vs_lru",
        "farthest-future copies fewer experts than LRU",
        "Abstract; §3.2",
        "2.1x (31,776 -> 15,087)",
        "±10% of 2.1x",
        replay_checks.ff_vs_lru,
    ),
    Claim(
        "ff_vs_bflat",
        "farthest-future within 3.5% of the fewest copies (bound B_flat)",
        "Abstract; App. §6",
        "3.4% (14,587 vs 15,087)",
        "gap <= 4.5%",
        replay_checks.ff_vs_bflat,
    ),
    Claim(
        "ff_vs_bstar",
        "farthest-future within 3.5% of the fewest copies (exact B*)",
        "Abstract; App. §6",
        "<= 3.5% (B* not computed)",
        "gap <= 3.5%",
        replay_checks.ff_vs_bstar,
    ),
    Claim(
        "foresight_16",
        "16 tokens of foresight recover most of the reduction",
        "Abstract; §3.2",
        "96%",
        "±5 points",
        replay_checks.foresight_16,
    ),
    Claim(
        "decayed_frequency",
        "decayed-frequency eviction, share of the LRU-oracle gap",
        "Abstract; §3.2; App. §7",
        "26.9%",
        "±5 points",
        replay_checks.gap_share("decayed-frequency", 0.269),
    ),
    Claim(
        "cost_model_winner",
        "equation (1) picks the measured winner at 10x and 50x",
        "§1; §3.1",
        "agrees at both",
        "same run; the two runs that decide it told apart (95% intervals)",
        replay_checks.cost_model_winner,
    ),
    Claim(
        "learned_scorers",
        "learned scorer with router features, share of the gap",
        "§3.2; App. §7",
        "32-33% (held out)",
        "±5 points of 32.5%",
        learned_checks.learned_scorers,
    ),
    Claim(
        "causal_rule",
        "best causal rule, share of the gap at every capacity (held out)",
        "§3.2; App. §7 (issue 41)",
        "26.9% (decayed frequency), 32.5% (learned)",
        ">= 50% at every C by its whole 95% interval",
        learned_checks.causal_rule,
    ),
    Claim(
        "tiers_lead",
        "farthest-future's lead over LRU in ms per token survives a disk tier and host "
        "compute (share saved per cell)",
        "beyond the paper (issue 40)",
        "not measured (farthest-future is optimal for one cache with forced admission)",
        "lower ms per token in every disk cell and with bypass",
        learned_checks.tiers_lead,
    ),
    Claim(
        "controller_t50",
        "controller at 0.5 copies 2.7x Dwell-16's at similar loss",
        "§3.3",
        "2.7x (+0.076 vs +0.067)",
        "±25% of 2.7x; heads trained to a plateau",
        controller_checks.controller_t50,
    ),
    Claim(
        "controller_high",
        "thresholds 0.8-0.9 lower traffic only with large losses",
        "§3.3",
        "+0.238, +0.350 (simple <= +0.110)",
        "lower traffic => loss above all simple; heads trained to a plateau",
        controller_checks.controller_high,
    ),
    Claim(
        "router_copies",
        "router fine-tuned for cache hits copies as many as before",
        "§3.3; App. §9",
        "+0.4% (32,050 vs 31,915)",
        "±2%; its simulated hit rate rose beyond its noise",
        router_checks.router_copies,
    ),
    Claim(
        "dwell_window",
        "Dwell's longer window lowers loss (and copies)",
        "Table 1; App. §5, §10",
        "+0.067 vs +0.085; +0.073 vs +0.150",
        "lower loss by a paired 95% interval",
        dwell_checks.dwell_window,
    ),
    Claim(
        "dp_greedy",
        "greedy farthest-future optimal on every exact-DP instance",
        "App. §6",
        "0 of 4.2e4 not optimal",
        "none not optimal",
        dwell_checks.dp_greedy,
    ),
    Claim(
        "mean_interval",
        "mean-interval eviction, share of the gap (today's reading: "
        "a once-seen expert evicted first)",
        "App. §7",
        "-17.5% (worse than LRU)",
        "±5 points",
        dwell_checks.mean_interval,
    ),
    Claim(
        "mean_interval_literal",
        "mean-interval eviction, share of the gap (literal reading: a once-seen expert kept)",
        "App. §7",
        "-17.5% (worse than LRU)",
        "±5 points",
        replay_checks.gap_share("mean-interval-literal", -0.175),
    ),
    Claim(
        "router_logit",
        "router-logit eviction copies more than LRU",
        "App. §7",
        "+46% (closed loop)",
        "±10 points",
        replay_checks.router_logit,
    ),
    Claim(
        "shuffled_control",
        "scorer on shuffled labels does worse than LRU",
        "App. §7",
        "-34% (router), -136% (past use)",
        "below 0",
        learned_checks.shuffled_control,
    ),
    Claim(
        "foresight_curve",
        "foresight curve, share of the gap at k = 1-32 tokens",
        "App. §7, Fig. 2",
        "17/31/51/76/96/99.7%",
        "±10 points at every k",
        replay_checks.foresight_curve,
    ),
    Claim(
        "table2_order",
        "fixed-set accuracy ordering: free >= oracle > recent > learned",
        "App. §8, Table 2",
        "0.484 >= 0.481 > 0.430 > 0.413",
        "same order, strict pairs told apart (paired 95%); free above chance",
        table2_checks.table2_order,
    ),
    Claim(
        "lfu_removes",
        "decayed frequency removes 12-15% of every router's copies",
        "App. §9, Table 3",
        "12-15%",
        "each within 9-18%; every tuned router's training rose beyond its noise",
        router_checks.lfu_removes,
    ),
]

# Where a claim differs and no experiment here tests why: its likely causes, stated as such,
# computed from the run's own config (its results files' settings) and records; a cause the
# config does not show is left out (the paper's model at the paper's trace length: none).
PAPER_TRACE = (8, 16)  # the paper's trace: 8 layers x 16 sequences


def scale_cause(settings: dict) -> list[str]:
    source = settings["model"]["source"]
    if source == "embedded":
        return [f"model scale: a tiny model trained here, not {PAPER_MODEL}"]
    return [] if PAPER_MODEL in source else [f"model: {source}, not {PAPER_MODEL}"]


def trace_cause(settings: dict, results: Results | None) -> list[str]:
    layers = len(settings["harness"]["restricted_layers"])
    sequences = results.trace_sequences(settings) if results else None
    if sequences is None:
        return []
    if layers >= PAPER_TRACE[0] and sequences >= PAPER_TRACE[1]:
        return []
    return [f"the trace's length ({layers} layers x {sequences} sequences here)"]


def steps_cause(settings: dict, section: str, what: str) -> list[str]:
    steps = settings.get(section, {}).get("steps")
    return [] if steps is None else [f"{what} {steps} steps here ({section}.steps)"]


def copy_share_cause(results: Results) -> list[str]:
    """Copies a small share of a step (blocking 1x runs' mean): the runs lie close."""
    try:
        runs = [read_run(results.path(p)) for p in runs_1x(results)[1]]
    except Missing:
        return []
    shares = [run.totals.get("copy_share") for run in runs]
    if None in shares:
        return []
    share = sum(shares) / len(shares)
    if share >= 0.5:
        return []
    return [f"copies are {share:.0%} of a step on {runs[0].device_name}, so runs lie close"]


def causes(settings: dict | None, results: Results | None = None) -> dict[str, str]:
    """Claim key -> its likely causes under `settings` (none without settings)."""
    if settings is None:
        return {}
    scale = scale_cause(settings)
    found = {
        key: scale
        for key in (
            "restrict_cost",
            "foresight_16",
            "decayed_frequency",
            "dwell_window",
            "mean_interval_literal",
            "shuffled_control",
            "foresight_curve",
            "lfu_removes",
            "causal_rule",
        )
    }
    found["ff_vs_lru"] = scale + trace_cause(settings, results)
    # A property of the bound, whatever the config.
    found["ff_vs_bflat"] = ["B_flat's slack grows with k / C; the exact B* shows greedy's own gap"]
    found["cost_model_winner"] = copy_share_cause(results) if results else []
    found["learned_scorers"] = scale + steps_cause(settings, "learned", "the scorers train for")
    heads = steps_cause(settings, "controller", "the heads train for")
    found["controller_t50"] = found["controller_high"] = scale + heads
    found["router_copies"] = scale + steps_cause(settings, "router_tuning", "GRPO for")
    found["router_logit"] = scale + ["replayed here, closed loop in the paper"]
    tasks = settings.get("accuracy", {}).get("tasks", {})
    questions = sorted({t.get("questions") for t in tasks.values() if t.get("questions")})
    if questions:
        many = "/".join(map(str, questions))
        found["table2_order"] = [f"{many} questions a task here (accuracy.tasks)"]
    return {key: "; ".join(said) for key, said in found.items() if said}


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
