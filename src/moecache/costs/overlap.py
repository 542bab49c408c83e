"""The overlap cost model, beside equation (1) (equation.py): a run whose copies overlap
compute (harness/overlapped_block.py) predicted from its blocking twin's compute c and copy
time tau, its copies per token and its prefetcher's accuracy.

Derivation (docs/overlap.md states it with its assumptions). One link moves one expert at a
time, tau(m) each; the compute runs beside it. Per token:

- The compute is c, equation (1)'s: the blocking run's step less its copies, at 1x. Of it,
  A ms run outside the MoE blocks (attention, norms, routers, the head): the window between
  one block's experts and the next block's, the only compute a next-layer prefetch can hide
  under. A is measured at the overlapped run's 1x twin: its step less its blocks' time.
- A layer's demand copies are known when it routes and are needed inside it. The compute
  takes the layer's experts in order, each right after its copy lands: the j experts it
  finishes before it waits on the last of the d copies hide j e of their d tau, e the
  compute of one expert (the 1x twin's blocks less their stalls, per expert computed). The
  harness counts each layer-token's group (d, j): counts of the decoding, not of the clock.
- A prefetch is issued a window ahead; the link moves every prefetch, used or not, and what
  the windows do not hide stalls the compute: max(0, n_p tau - A). Demand copies queue behind
  prefetches on the one link, so the two stalls add.
- A used prefetch is a demand copy saved: the groups hold n - a n_p copies a token, n the
  copies the token would make on demand (demand plus used prefetches) and a the
  prefetcher's accuracy.

    T(m) = c + sum over groups of max(0, d tau(m) - j e) + max(0, n_p tau(m) - A)

With no prefetcher and nothing computed before the copies (j = 0, as a kernel that takes
all of a token's experts at once) it is equation (1): the demand copies stall as blocking
copies do. The eviction rule matters through the groups: FF and LRU differ by the copies
FF saves, hidden only where the layer's compute or prefetches cover them. Intervals: the
measured run's own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from moecache.errors import MoecacheError

WITHIN = 0.10  # issue 28: every overlapped run within 10% of the model
GROUPS = "demand_groups"  # [[copies, experts computed before the last, tokens], ...]


def merged_groups(lists) -> list:
    """Demand groups (AsyncExpertPool.count_demand) of several layers or sequences, summed."""
    total = Counter()
    for groups in lists:
        for copies, before, tokens in groups:
            total[(copies, before)] += tokens
    return [[copies, before, tokens] for (copies, before), tokens in sorted(total.items())]


def timed(report: dict) -> int:
    """The timed tokens of a results file (or twin record): every per-token figure's divisor."""
    return summed(report, "timed_tokens")


def summed(report: dict, *keys: str) -> float:
    """The sum of `keys` over the file's sequences (0 for a key a row lacks)."""
    return sum(r.get(key, 0) for r in report.get("sequences", []) for key in keys)


def per_token(report: dict) -> dict:
    """An overlapped run's counts per timed token: n (demand plus used prefetches), n_p, a,
    and its demand groups."""
    return {
        "n": summed(report, "demand_copies", "prefetch_used") / timed(report),
        "n_prefetch": summed(report, "prefetch_copies") / timed(report),
        "accuracy": report["totals"].get("prefetch_accuracy") or 0.0,
        "groups": demand_groups(report),
    }


def demand_groups(report: dict) -> tuple:
    """(d, j, layer-tokens per timed token): its demand groups (harness AsyncExpertPool.
    count_demand). A file recorded before the harness counted them: each demand copy a
    group of its own with nothing computed before it, so that every copy stalls."""
    rows = report.get("sequences", [])
    if rows and all(GROUPS in row for row in rows):
        groups = merged_groups(row[GROUPS] for row in rows)
    else:
        groups = [[1, 0, summed(report, "demand_copies")]]
    return tuple((d, j, tokens / timed(report)) for d, j, tokens in groups if tokens)


def expert_ms(report: dict) -> float:
    """e: one expert's compute in an overlapped run's blocks, their time less the stalls
    over the experts computed (0 for a file that did not count them: nothing hides)."""
    computed = summed(report, "experts_computed")
    busy = summed(report, "block_seconds") - summed(report, "stall_seconds")
    return 1e3 * busy / computed if computed else 0.0


def compute_ms(report: dict) -> float:
    """c of a blocking 1x run (or twin record): step less its own timed copies, per token.
    Of an overlapped run, whose copy seconds are its stalls (harness/overlap.py): its
    compute as measured, which a slower link should leave alone."""
    return 1e3 * (summed(report, "step_seconds") - summed(report, "copy_seconds")) / timed(report)


def tau1_ms(report: dict) -> float | None:
    """tau(1) as a blocking 1x run timed its own copies (None: it made none)."""
    copies = summed(report, "timed_copies")
    return 1e3 * summed(report, "copy_seconds") / copies if copies else None


def link_tau_ms(report: dict) -> float:
    """tau(m) as the overlapped run's link ran: its copy engine's busy time per copy."""
    busy = summed(report, "stall_seconds", "hidden_copy_seconds")
    copies = summed(report, "demand_copies", "prefetch_copies")
    return 1e3 * busy / copies if copies else 0.0


def outside_blocks_ms(report: dict) -> float:
    """A: an overlapped run's compute outside its MoE blocks per token (step less blocks)."""
    return 1e3 * (summed(report, "step_seconds") - summed(report, "block_seconds")) / timed(report)


def predict(c: float, tau: float, groups, expert: float, n_prefetch: float, window: float):
    """T = c + sum over groups (d, j, per token) of max(0, d tau - j e) + max(0, n_p tau - A),
    ms per token."""
    demand = sum(share * max(0.0, d * tau - j * expert) for d, j, share in groups)
    return c + demand + max(0.0, n_prefetch * tau - window)


def same_run(a: dict, b: dict) -> bool:
    return (a["policy"], a.get("params", {})) == (b["policy"], b.get("params", {}))


def blocking_base(report: dict, reports: list[dict]) -> dict | None:
    """Equation (1)'s base on the tokens `report` decoded: the blocking run of the same
    policy at 1x (for a run at m > 1, the blocking run at m's 1x twin, decoded on the same
    cut sequences); None when the blocking run was not decoded."""
    m = report["multiplier"]
    for r in reports:
        if r.get("overlap") or r.get("shard") != report.get("shard") or not same_run(r, report):
            continue
        if m == 1 and r["multiplier"] == 1:
            return on_sequences(r, {row["sequence"] for row in report["sequences"]})
        if m > 1 and r["multiplier"] == m and r.get("twin_1x"):
            return r["twin_1x"]
    return None


def on_sequences(report: dict, sequences: set) -> dict:
    """`report` with only the rows of `sequences` (a 1x overlapped run decodes the first few)."""
    return {**report, "sequences": [r for r in report["sequences"] if r["sequence"] in sequences]}


def overlapped_1x(report: dict) -> dict | None:
    """The overlapped run at 1x on the tokens it decoded: itself, or its 1x twin."""
    return report if report["multiplier"] == 1 else report.get("twin_1x")


def step_ms(report: dict) -> float:
    return 1e3 * summed(report, "step_seconds") / timed(report)


def stall_ms(report: dict, window: float, expert: float) -> float:
    """The model's stall per token of an overlapped run (predict with c = 0)."""
    counts = per_token(report)
    return predict(0.0, link_tau_ms(report), counts["groups"], expert, counts["n_prefetch"], window)


def model_row(report: dict, base: dict) -> dict:
    """One overlapped run against the model: its inputs, predicted and measured ms/token.
    c' is the overlapped run's compute at 1x, its step less the model's stall there (so the
    model reproduces the 1x step, as equation (1) does); c' - c, the blocking run's c, is
    what running the copy engine beside the compute costs the compute."""
    m, one = report["multiplier"], overlapped_1x(report)
    window, expert = outside_blocks_ms(one), expert_ms(one)
    c = compute_ms(base)
    c_overlap = step_ms(one) - stall_ms(one, window, expert)
    predicted = c_overlap + stall_ms(report, window, expert)
    counts, totals = per_token(report), report["totals"]
    measured = totals["step_ms"]
    error = predicted / measured - 1
    tau1 = tau1_ms(base) or 0.0
    return {
        "run": report["run"],
        "policy": report["policy"],
        "prefetch": report.get("prefetch"),
        "multiplier": m,
        "c_ms": c,
        "c_overlap_ms": c_overlap,
        "window_ms": window,
        "expert_ms": expert,
        "tau_ms": link_tau_ms(report),
        "tau_blocking_ms": m * tau1,
        "n": counts["n"],
        "n_prefetch": counts["n_prefetch"],
        "accuracy": counts["accuracy"],
        "groups": counts["groups"],
        "copy_compute_ratio": blocking_copies(base) * m * tau1 / c,
        "compute_ratio_to_1x": compute_ms(report) / compute_ms(one),
        "predicted_ms": predicted,
        "measured_ms": measured,
        "measured_lo": totals["step_ms_ci"][0],
        "measured_hi": totals["step_ms_ci"][1],
        "relative_error": error,
        "within_10pct": bool(abs(error) <= WITHIN),
    }


def blocking_copies(report: dict) -> float:
    return summed(report, "timed_copies") / timed(report)


def model_rows(reports: list[dict], strict: bool = True) -> list[dict]:
    """A row per overlapped run (model_row), by multiplier and run; one without its
    blocking run refuses (strict) or is left out."""
    rows = []
    for report in reports:
        if not report.get("overlap"):
            continue
        base = blocking_base(report, reports)
        if not (base and timed(base) and timed(report) and timed(overlapped_1x(report) or {})):
            base = None  # nothing decoded to model (a results file of no sequences)
        if base is None and not strict:
            continue
        if base is None:
            raise MoecacheError(
                f"run {report['run']} at {report['multiplier']}x: the overlap cost model needs "
                f"the blocking run of policy {report['policy']} at {report['multiplier']}x"
            )
        rows.append(model_row(report, base))
    return sorted(rows, key=lambda r: (r["multiplier"], r["run"]))


MATTERS = 0.05  # the eviction rule matters while it changes the step by more than this share


def stops_mattering(reports: list[dict]) -> dict | None:
    """The copy-to-compute ratio (LRU's blocking copies per token x tau over c) below which,
    by the model, overlapped farthest-future's stall differs from overlapped LRU's by less
    than MATTERS of LRU's step: the rule's choice is then hidden under compute. None without
    both overlapped runs at 1x (with the same prefetcher where possible)."""
    ones = [r for r in model_rows(reports, strict=False) if r["multiplier"] == 1]
    lru = [r for r in ones if r["policy"] == "lru"]
    ff = [r for r in ones if r["policy"] == "farthest-future"]
    if not lru or not ff:
        return None
    a, b = prefetch_pair(lru, ff)
    tau1 = a["tau_blocking_ms"]
    if not tau1:
        return None
    below = None
    for tau in tau1 * np.geomspace(1e-3, 1e3, 601):
        lru_ms = a["c_overlap_ms"] + row_stall(a, tau)
        if row_stall(a, tau) - row_stall(b, tau) > MATTERS * lru_ms:
            break
        below = tau
    if below is None or below == tau1 * 1e3:
        return None
    ratio = a["copy_compute_ratio"] * below / tau1
    return {"ratio": ratio, "tau_ms": below, "share": MATTERS, "lru": a["run"], "ff": b["run"]}


def prefetch_pair(first: list[dict], second: list[dict]) -> tuple[dict, dict]:
    """One of `first` and one of `second` (runs or model rows, neither list empty) with the
    same prefetcher where two have one, else the first of each."""
    same = [(a, b) for a in first for b in second if a["prefetch"] == b["prefetch"]]
    return same[0] if same else (first[0], second[0])


def row_stall(row: dict, tau: float) -> float:
    return predict(0.0, tau, row["groups"], row["expert_ms"], row["n_prefetch"], row["window_ms"])


# --- the chooser's overlapped candidates (moecache choose --overlap) --------------------------


@dataclass(frozen=True)
class OverlappedPoint:
    """An overlapped 1x run as `moecache choose --overlap` ranks it beside equation (1)'s
    lines: the model's T(tau) from its c', copies, accuracy and window. Its cost is not a
    line in tau, so it has no crossovers; it decoded other sequences than the blocking runs'
    (the scaled runs' first ones), so it is compared with them by prediction only."""

    run: str
    policy: str
    delta_nll: float
    compute_ms: float  # c'
    n: float
    n_prefetch: float
    accuracy: float
    window_ms: float
    step_ms: float
    groups: tuple = ()  # (d, j, per token): its demand groups
    expert_ms: float = 0.0
    tau1_ms: float | None = None
    sequences: tuple = ()  # not paired with any blocking run's
    shard: str | None = None
    own_tau_ms: float | None = None
    overlap: bool = True

    @property
    def rho(self) -> float:
        return self.n

    def ms_per_token(self, tau_ms: float) -> float:
        return predict(
            self.compute_ms, tau_ms, self.groups, self.expert_ms, self.n_prefetch, self.window_ms
        )

    def predicted_interval(self, tau_ms: float, seed: int = 0, level: float = 0.95):
        return None


def choice_points(reports: list[dict], tau1_ms: float | None) -> list[OverlappedPoint]:
    """The overlapped 1x runs among `reports` (each beside its blocking run) as candidates."""
    by_run = {r["run"]: r for r in reports if r.get("overlap")}
    points = []
    for row in model_rows(reports):
        if row["multiplier"] != 1:
            continue
        report = by_run[row["run"]]
        points.append(
            OverlappedPoint(
                run=row["run"],
                policy=row["policy"],
                delta_nll=report["totals"]["delta_nll"],
                compute_ms=row["c_overlap_ms"],
                n=row["n"],
                n_prefetch=row["n_prefetch"],
                accuracy=row["accuracy"],
                window_ms=row["window_ms"],
                step_ms=row["measured_ms"],
                groups=row["groups"],
                expert_ms=row["expert_ms"],
                tau1_ms=tau1_ms,
                shard=report.get("shard"),
            )
        )
    return points
