"""The learned rules' claims: the scorers against LRU, the causal rule's share of the gap,
farthest-future's lead over two tiers, and the shuffled control."""

from __future__ import annotations

from moecache.records.learned import LearnedEvaluation
from moecache.report.evidence import (
    PAPER_RATIO,
    Found,
    Missing,
    Results,
    joined,
    judged,
    near,
    pct,
    verdict,
)


def learned_rows(r: Results) -> tuple[dict, int, str, str]:
    evaluation, path = r.read(
        "results/learned/evaluation.json", "learned evaluation", LearnedEvaluation
    )
    shard = next((s for s in r.shards if s in evaluation["shards"]), None)
    if shard is None:
        raise Missing(f"no shard evaluated in {path}")
    heldout = evaluation["shards"][shard]["replay"]["heldout"]
    return heldout, evaluation["capacity"], f"C = {evaluation['capacity']}, shard {shard}", path


def learned_scorers(r: Results) -> Found:
    heldout, capacity, setting, path = learned_rows(r)
    router = {
        n: v["gap_recovered"]
        for n, v in heldout.items()
        if n.startswith("router/") and not n.endswith("-permuted")
    }
    if not router:
        raise Missing(f"no router-feature scorer in {path}")
    best = max(sorted(router), key=router.get)
    replay, _, _ = r.replay("replay")
    why = (
        ""
        if capacity == PAPER_RATIO * replay["experts"]
        else (f"scorers trained and evaluated at the harness's C = {capacity} only")
    )
    value = f"{pct(router[best])} ({best}, held out)"
    return Found(value, judged(near(router[best], 0.325, 0.05), why), setting, why, [path])


def causal_rule(r: Results) -> Found:
    """The best causal rule of the causal study (report/causal.py), at every capacity and
    shard; holds when its interval lies above half the gap everywhere, differs when it lies
    below half anywhere, and is undecided where an interval straddles half."""
    from moecache.report import causal

    relative = "results/learned/causal.json"
    if not (r.workdir / relative).exists():
        raise Missing(f"no causal rules' study ({relative})")
    study = causal.read(r.path(relative))
    rule, texts, _ = causal.best_rule(study)
    below, straddling = causal.target_calls(study)
    too_small = ""
    if straddling and not below:
        too_small = (
            "the interval straddles half of the gap at "
            + "; ".join(straddling)
            + ": a shard of that many sequences would decide it (corpus.heldout.sequences)"
        )
    shown = len(study.capacities)  # the first shard at every capacity; the others beside
    capacities = ", ".join(map(str, study.capacities))
    found = Found(
        f"{'; '.join(texts[:shown])} ({rule})",
        judged(not below, "", too_small),
        f"C = {capacities}, every sequence",
        too_small,
        [relative],
    )
    found.elsewhere.extend(texts[shown:])
    checked = "results/learned/causal-check.json"
    if (r.workdir / checked).exists():
        check = causal.read_check(r.path(checked))
        if rule in check.cost["rules"]:
            found.why = joined(found.why, causal.check_words(check, rule))
            found.sources.append(checked)
    return found


def tiers_lead(r: Results) -> Found:
    """Farthest-future against LRU over two tiers (report/verdicts/tiers.py): the share of
    ms per token it saves in every cell of the grid; holds when it costs less than LRU in
    every disk cell with admission always and in every cell with bypass."""
    from moecache.report import tiers

    relative = "results/tiers/grid.json"
    if not (r.workdir / relative).exists():
        raise Missing(f"no tiered replay's grid ({relative})")
    grid = tiers.read(r.path(relative))
    found_verdict = tiers.verdict_of(grid)
    texts = tiers.lead_texts(found_verdict)
    first = texts[0][0]
    hosts = ", ".join(tiers.host_text(h) for h in grid.hosts)
    found = Found(
        "; ".join(text for shard, text in texts if shard == first),
        verdict(found_verdict.ms_with_disk and found_verdict.ms_with_compute),
        f"C = {', '.join(map(str, grid.capacities))}; H = {hosts}; config prices",
        "",
        [relative],
    )
    found.elsewhere.extend(text for shard, text in texts if shard != first)
    return found


def shuffled_control(r: Results) -> Found:
    heldout, _, setting, path = learned_rows(r)
    control = heldout.get("router/mlp-permuted")
    if control is None or control["gap_recovered"] is None:
        raise Missing(f"no router/mlp-permuted control in {path}")
    share = control["gap_recovered"]
    return Found(
        f"{pct(share)} (router/mlp-permuted, held out)", verdict(share < 0), setting, "", [path]
    )
