"""The controller's claims: its copies and loss at the paper's threshold and above, with
whether its heads trained to a plateau."""

from __future__ import annotations

from moecache.records.controller import HeadsLog
from moecache.records.io import read_dict
from moecache.report.evidence import (
    Found,
    Missing,
    Results,
    joined,
    judged,
    model_why,
    near,
    runs_1x,
)
from moecache.report.power import PLATEAU_SHARE, Plateau, about
from moecache.runs import HeadsName, at_multiplier


def controller_frames(r: Results):
    """The controller sweep at 1x: seed means per objective and threshold, and the simple
    restricting runs decoded beside it."""
    from moecache.report import controller as ctl

    folders = r.glob(f"results/controller/sweep/{at_multiplier(1, '')}", "controller sweep")
    files = [f for folder in folders for f in r.glob(f"{folder}/*.json", "sweep results")]
    rows = ctl.sweep_rows([r.path(folder) for folder in folders])
    reference = rows[(rows["objective"] == "") & (rows["multiplier"] == 1)]
    seeds = ctl.seeds_frame(rows)
    if seeds.empty or reference.empty:
        raise Missing("no controller or no simple policy in the sweep")
    objective = seeds["objective"].iloc[0]
    return seeds[seeds["objective"] == objective], reference, objective, files


def controller_t50(r: Results) -> Found:
    seeds, reference, objective, files = controller_frames(r)
    at = seeds[seeds["threshold"] == 0.5]
    # The paper's Dwell-16, else the first dwell run the sweep compares.
    dwell = reference[reference["run"] == "dwell-16"]
    dwell = dwell if len(dwell) else reference[reference["run"].str.startswith("dwell")]
    if at.empty or dwell.empty:
        raise Missing("no controller at threshold 0.5 or no dwell run in the sweep")
    mine, theirs = at.iloc[0], dwell.iloc[0]
    if theirs["copies_per_token"] == 0:
        raise Missing(f"{theirs['run']} copied nothing in the sweep")
    ratio = mine["copies_per_token"] / theirs["copies_per_token"]
    value = (
        f"{ratio:.2f}x {theirs['run']}'s (Delta NLL {mine['delta_nll']:+.3f} against "
        f"{theirs['delta_nll']:+.3f})"
    )
    why = model_why(r, runs_1x(r)[1])
    ok = near(ratio / 2.7, 1, 0.25)
    too_small, logs = heads_power(r, objective)
    return Found(
        value,
        judged(ok, "", too_small),
        f"threshold 0.5, {objective}, seed mean",
        joined(too_small, why),
        [*files, *logs],
    )


def controller_high(r: Results) -> Found:
    seeds, reference, objective, files = controller_frames(r)
    high = seeds[seeds["threshold"] >= 0.8]
    if high.empty:
        raise Missing("no controller threshold of 0.8 or more in the sweep")
    worst_simple = reference["delta_nll"].max()
    least_traffic = reference["copies_per_token"].min()
    cells, ok = [], True
    for _, row in high.iterrows():
        lower = row["copies_per_token"] < least_traffic
        ok &= not lower or row["delta_nll"] > worst_simple
        cells.append(
            f"{row['threshold']:g}: {row['delta_nll']:+.3f} at {row['copies_per_token']:.2f}"
        )
    value = "; ".join(cells) + f" (simple policies at most {worst_simple:+.3f})"
    too_small, logs = heads_power(r, objective)
    setting = f"thresholds >= 0.8, {objective}"
    return Found(value, judged(ok, "", too_small), setting, too_small, [*files, *logs])


def heads_power(r: Results, objective: str) -> tuple[str, list[str]]:
    """Why the controller's heads cannot decide its claims ('' where each unpriced heads
    file of `objective`, the sweep's seed mean, trained to a plateau), and the logs read:
    a controller still learning is not the controller the claims describe."""
    from moecache.report.verdicts.controller import heads_plateau

    folder = r.workdir / "results/controller/heads"
    paths = [p for p in sorted(folder.glob(f"{objective}-s*.json")) if unpriced(p.stem)]
    if not paths:
        return f"no training log of the {objective} heads (results/controller/heads/)", []
    reasons = []
    for path in paths:
        log = read_dict(path, HeadsLog)
        reasons.append(plateau_words(path.stem, log["steps"], heads_plateau(log)))
    return joined(*reasons), [p.relative_to(r.workdir).as_posix() for p in paths]


def unpriced(name: str) -> bool:
    return HeadsName.parse(name).price is None


def plateau_words(name: str, steps: int, found: Plateau | None) -> str:
    """Why a heads file's objective shows no plateau ('' where it does), with the steps of
    training that would show one at the scatter its log shows."""
    if found is None:
        return f"the {name} heads trained {steps} steps, too few to tell a plateau (6 at least)"
    if not found.whole.falls:
        return (
            f"the {name} heads' objective did not fall beyond its noise "
            f"({found.whole.text()}): train until it does (controller.steps)"
        )
    if found.reached:
        return ""
    low, high = found.change
    return (
        f"the {name} heads trained {steps} steps and their objective was still moving over "
        f"the last {found.tail.steps} ({low:+.3f} to {high:+.3f} by its 95% interval, a "
        f"plateau within {found.tolerance:.3f}, {PLATEAU_SHARE:.0%} of its fall "
        f"{found.whole.start:.3f} -> {found.whole.end:.3f}): train to a plateau "
        f"(controller.steps; at this scatter {about(found.steps_needed())} steps would show "
        "one, once it is flat)"
    )
