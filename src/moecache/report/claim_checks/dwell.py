"""The restricting rules' claims: the greedy set against the DP, Dwell-k's window, and
the mean-interval rule."""

from __future__ import annotations

from pathlib import Path

from moecache.intervals import paired_difference
from moecache.records.io import read_run
from moecache.records.replay import OptimumSweep
from moecache.report.claim_checks.replay import gap_share, share_of
from moecache.report.evidence import Found, Missing, Results, joined, judged, runs_1x, verdict
from moecache.report.power import about, size_to_clear


def dp_greedy(r: Results) -> Found:
    sweep, path = r.read("results/replay/optimum-sweep.json", "optimum sweep", OptimumSweep)
    value = f"not optimal on {sweep['greedy_not_optimal']:,} of {sweep['instances']:,}"
    return Found(value, verdict(sweep["greedy_not_optimal"] == 0), "random instances", "", [path])


def dwell_window(r: Results) -> Found:
    # Blocking runs only: an overlapped Dwell decodes fewer sequences (its loss is on those).
    points, paths = runs_1x(r)
    dwell = [  # (window / k, k, run)
        (p.params["window"] / p.params["k"], p.params["k"], p)
        for p in points
        if p.policy == "dwell"
    ]
    if len({d[0] for d in dwell}) < 2:
        raise Missing("no two dwell runs with windows of different length")
    short, long = min(dwell, key=lambda d: d[0]), max(dwell, key=lambda d: d[0])
    a, b = long[2], short[2]
    value = (
        f"{a.run} {a.delta_nll:+.3f} at rho {a.rho:.2f} against {b.run} "
        f"{b.delta_nll:+.3f} at rho {b.rho:.2f}"
    )
    # Copies compare only at the same k (a longer dwell copies less whatever its window);
    # they are exact counts, so only the loss has an interval to weigh.
    same_k = long[1] == short[1]
    paired = shard_pairs(r, a, b)
    lower, said = lower_loss(a, b, [pair for pairs, _ in paired.values() for pair in pairs])
    too_small = said if lower is None else ""
    if same_k and a.rho >= b.rho:  # more copies: the claim fails whatever the loss says
        lower, too_small = False, ""
    note = "" if same_k else "different k: loss compared, copies not"
    setting = f"1x; loss paired on shard{'s' if len(paired) > 1 else ''} {', '.join(paired)}"
    read = [f for _, files in paired.values() for f in files]
    found = judged(bool(lower), "", too_small)
    return Found(value, found, setting, joined(too_small, note), sorted({*paths, *read}))


def shard_pairs(r: Results, a, b) -> dict[str, tuple[list, list[str]]]:
    """Per shard whose 1x files of runs `a` and `b` share decoded sequences: their rows
    paired by sequence, and the two files."""
    found = {}
    for shard in r.shards:
        files = [f"results/runs/{shard}/{Path(run.path).name}" for run in (a, b)]
        if not all(Path(r.path(f)).exists() for f in files):
            continue
        rows_a, rows_b = (
            {row.sequence: row for row in read_run(r.path(f)).sequences} for f in files
        )
        pairs = [(rows_a[s], rows_b[s]) for s in sorted(set(rows_a) & set(rows_b))]
        if pairs:
            found[shard] = (pairs, files)
    return found


def lower_loss(a, b, pairs: list) -> tuple[bool | None, str]:
    """Whether run `a` loses less than run `b` by a paired 95% interval over `pairs`, their
    rows of the same sequences (NLL per sequence); None with the sequences that would tell."""
    if not pairs:
        return None, f"{a.run} and {b.run} share no decoded sequence to pair their losses on"
    point, interval = paired_difference(
        [x.nll_sum for x, _ in pairs],
        [x.scored for x, _ in pairs],
        [y.nll_sum for _, y in pairs],
        [y.scored for _, y in pairs],
    )
    if interval[1] < 0 or interval[0] > 0:
        return interval[1] < 0, ""
    size = size_to_clear(len(pairs), point, interval, 0.0)
    return None, (
        f"{a.run} - {b.run} NLL {point:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}] on "
        f"{len(pairs)} sequences: {about(size)} sequences would tell them apart "
        "(corpus.heldout.sequences)"
    )


def mean_interval(r: Results) -> Found:
    """Today's reading, with the tested cause beside it: the literal reading's share on
    the same trace and capacity (the two differ only in the once-seen convention)."""
    found = gap_share("mean-interval", -0.175)(r)
    report, _, _ = r.replay("replay")
    try:
        literal = share_of("mean-interval-literal")(report)[1]
    except Missing:
        return found
    note = f"the literal reading, a once-seen expert kept, recovers {literal} on this trace"
    found.why = "; ".join(filter(None, [found.why, note]))
    return found
