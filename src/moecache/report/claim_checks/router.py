"""The tuned routers' claims: whether they copy as many as the base, what decayed
frequency removes of each, and whether their training rose."""

from __future__ import annotations

from moecache.records.io import read_dict
from moecache.records.router_tuning import TunedModel, TuningLog
from moecache.report.evidence import Found, Missing, Results, joined, judged, near, pct
from moecache.report.power import Trend, about, steps_to_show
from moecache.report.verdicts.router_tuning import LEARNED_SERIES, SERIES_WORDS, learned_trend


def router_measured(r: Results) -> tuple[dict, list[str]]:
    paths = r.glob("results/router_tuning/measured/*.json", "router measurements")
    measured = [read_dict(r.path(p), TunedModel) for p in paths]
    found = {m["model"]: m for m in measured}
    if "base" not in found:
        raise Missing("no measurement of the untuned router")
    return found, paths


def router_copies(r: Results) -> Found:
    found, paths = router_measured(r)
    if "hit" not in found:
        raise Missing("no cache-hit reward router measured")
    change = (
        found["hit"]["teacher_forced"]["lru_steady"] / found["base"]["teacher_forced"]["lru_steady"]
        - 1
    )
    too_small, logs = routers_learned(r, ["hit"])
    return Found(
        f"{change:+.1%} LRU copies",
        judged(near(change, 0, 0.02), "", too_small),
        "lossless LRU",
        too_small,
        [*paths, *logs],
    )


def lfu_removes(r: Results) -> Found:
    found, paths = router_measured(r)
    removed = {
        name: 1
        - m["teacher_forced"]["decayed_frequency_steady"] / m["teacher_forced"]["lru_steady"]
        for name, m in found.items()
    }
    low, high = min(removed.values()), max(removed.values())
    value = f"{pct(low)} to {pct(high)} ({len(removed)} routers)"
    ok = near(low, 0.135, 0.045) and near(high, 0.135, 0.045)  # every one in 9-18%
    # Every router measured: the tuned ones must have learned for "every router" to mean
    # more than the untuned one measured again.
    too_small, logs = routers_learned(r, [name for name in LEARNED_SERIES if name in found])
    setting = "lossless, every variant"
    return Found(value, judged(ok, "", too_small), setting, too_small, [*paths, *logs])


def routers_learned(r: Results, names: list[str]) -> tuple[str, list[str]]:
    """Why the tuned routers `names` cannot decide a claim on routers tuned for cache hits
    ('' where each one's training series rose beyond its noise: report/verdicts/
    router_tuning.py), and the training logs read. A router that learned nothing copies
    as many as before trivially."""
    reasons, logs = [], []
    for name in names:
        relative = f"results/router_tuning/{name}/training.json"
        if not (r.workdir / relative).exists():
            reasons.append(f"no per-step training log of the {name} router ({relative})")
            continue
        log = read_dict(r.path(relative), TuningLog)
        logs.append(relative)
        reasons.append(rise_words(name, log["steps"], learned_trend(log)))
    return joined(*reasons), logs


def rise_words(name: str, steps: int, found: Trend | None) -> str:
    """Why a router's training series shows no rise ('' where it rose beyond its noise),
    with the steps that would show one at its slope and scatter."""
    series = SERIES_WORDS[LEARNED_SERIES[name]]
    if found is None:
        return f"the {name} router trained {steps} steps, too few to tell its {series} from noise"
    if found.rises:
        return ""
    more = (
        f"; at this slope and scatter {about(steps_to_show(found))} steps"
        if found.slope > 0
        else ""
    )
    return (
        f"the {name} router's {series} did not rise beyond its noise ({found.text()}): "
        f"train until it does (router_tuning.steps{more})"
    )
