"""The scientific verdicts the tables state are decided in report/verdicts/, on the stages'
results' numbers: Table 3's gap verdict (verdicts.router_tuning) and the learned scorers'
(verdicts.learned), the controller's comparisons (verdicts.controller). Each flips when its
input crosses the threshold."""

import pandas as pd
import pytest

from moecache.report.tables.table3 import verdict_line
from moecache.report.verdicts import controller as controller_verdicts
from moecache.report.verdicts.learned import learned_verdict
from moecache.report.verdicts.router_tuning import gap_verdicts


def measured(own_hit: float, lru: float, log=(0.30, 0.50), reward=None) -> dict:
    training = {"log_reward": reward or {"start": 1.0, "end": 2.0}, "log_sim_hit_rate": {}}
    training["log_sim_hit_rate"] = {"start": log[0], "end": log[1]}
    return {
        "training": training,
        "teacher_forced": {"trained_layer_hit_rate": 0.5, "lru_steady": lru},
        "own_generations": {"trained_layer_hit_rate": own_hit},
    }


def found(own_hit: float, **kw) -> dict:
    base = measured(0.40, 100.0)
    base["training"] = None
    return {"base": base, "hit": measured(own_hit, 100.0, **kw)}


@pytest.mark.parametrize("own_hit, closes", [(0.51, True), (0.49, False)])
def test_half_the_simulated_gain_decides_the_gap(own_hit, closes):
    # Logged gain 0.20: half of it is 0.10 beyond the base's 0.40 on its own generations.
    (verdict,) = gap_verdicts(found(own_hit))
    assert verdict.model == "hit" and verdict.closes is closes and not verdict.against_sft
    assert verdict_line(verdict).endswith(f"the simulated gain: {'yes' if closes else 'no'}.")


def test_no_logged_gain_leaves_no_gap_to_close():
    (verdict,) = gap_verdicts(found(0.9, log=(0.5, 0.4)))
    assert verdict.closes is None
    assert verdict_line(verdict).endswith("so there is no gap to close.")


@pytest.mark.parametrize("lru, closes", [(79.0, True), (81.0, False)])
def test_the_harness_variant_is_judged_on_its_logged_copies(lru, closes):
    runs = found(0.4)
    # Reward is minus copies per token: -10 to -6 is 40% fewer copies; half is 20%.
    runs["harness"] = measured(0.4, lru, reward={"start": -10.0, "end": -6.0})
    verdicts = {v.model: v for v in gap_verdicts(runs)}
    assert verdicts["harness"].closes is closes


def evaluation(shares: dict[str, tuple[float, float]]) -> dict:
    shards = {
        shard: {
            "replay": {
                "heldout": {name: {"gap_recovered": values[i]} for name, values in shares.items()}
            }
        }
        for i, shard in enumerate(("a", "b"))
    }
    return {"shards": shards}


def test_the_best_learned_scorer_is_the_best_on_its_worst_shard():
    verdict = learned_verdict(
        evaluation(
            {
                "decayed-frequency": (0.2, 0.1),
                "router/mlp": (0.9, 0.4),
                "past-use/mlp": (0.6, 0.55),
                "router/mlp-permuted": (0.95, 0.95),  # a control: never the best
            }
        )
    )
    assert verdict.best == "past-use/mlp" and verdict.half_of_gap and verdict.beats_decayed


def test_a_scorer_below_decayed_frequency_on_one_shard_fails_the_verdict():
    verdict = learned_verdict(
        evaluation({"decayed-frequency": (0.3, 0.3), "router/mlp": (0.4, 0.2)})
    )
    assert verdict.best == "router/mlp" and not verdict.beats_decayed and not verdict.half_of_gap


def simple_runs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run": ["dwell-16", "static"],
            "delta_nll": [0.15, 0.20],
            "copies_per_token": [1.2, 0.7],
        }
    )


@pytest.mark.parametrize(
    "delta_nll, copies, traffic, quality",
    [(0.16, 1.1, "dwell-16", "dwell-16"), (0.19, 1.1, "dwell-16", "static")],
)
def test_the_controller_is_matched_to_the_nearest_simple_run(delta_nll, copies, traffic, quality):
    seeds = pd.DataFrame(
        {
            "objective": ["differentiable"],
            "threshold": [0.5],
            "seeds": [3],
            "delta_nll": [delta_nll],
            "copies_per_token": [copies],
            "tokens_between_refreshes": [4.0],
        }
    )
    (m,) = controller_verdicts.matched(seeds, simple_runs())
    assert (m.traffic_run, m.quality_run) == (traffic, quality)
    expected = 1.2 if quality == "dwell-16" else 0.7
    assert m.copies_ratio == pytest.approx(copies / expected)
    assert controller_verdicts.matched(seeds, simple_runs().iloc[:0]) == []


@pytest.mark.parametrize("whole, toward", [(0.05, True), (0.15, False)])
def test_longer_sequences_move_the_gap_toward_the_controller_or_away(whole, toward):
    summary = {
        "piece_tokens": 64,
        "tokens": 256,
        "pieces": {"controller-t50": {"delta_nll": 0.2}, "dwell-16": {"delta_nll": 0.1}},
        "whole": {"controller-t50": {"delta_nll": 0.1 + whole}, "dwell-16": {"delta_nll": 0.1}},
    }
    (g,) = controller_verdicts.longer(summary)
    assert (g.controller, g.other) == ("controller-t50", "dwell-16")
    assert g.in_pieces == pytest.approx(0.1) and g.whole == pytest.approx(whole)
    assert g.toward_controller is toward


# Power (report/power.py): the numbers the scorecard's undecided verdict is made of.


def test_a_trend_rises_only_beyond_its_own_noise():
    from moecache.report.power import steps_to_show, t95, trend

    assert t95(2) == pytest.approx(4.303, abs=1e-3) and t95(30) == pytest.approx(2.042, abs=1e-3)
    assert trend([0.5, 0.6]) is None  # two steps: no noise to measure
    rising = trend([0.40, 0.44, 0.47, 0.52, 0.55, 0.60])
    assert rising.rises and not rising.falls and rising.slope == pytest.approx(0.04, abs=0.002)
    published = trend([0.468, 0.554, 0.453, 0.444])  # the published hit router's log
    assert not published.rises and (published.start, published.end) == (0.468, 0.444)
    assert published.text().startswith("0.468 -> 0.444 over 4 steps, slope -0.017 a step [")
    assert published.slope < 0  # it fell: no length of training at this slope shows a rise
    slow = trend([0.50, 0.49, 0.53, 0.50, 0.54, 0.51])
    needed = steps_to_show(slow)
    assert not slow.rises and needed > 6
    # At that many steps the same slope and scatter clear 0.
    longer = [0.50 + slow.slope * i + (0.02 if i % 2 else -0.02) for i in range(needed * 2)]
    assert trend(longer).rises


def test_a_plateau_is_flat_within_a_tenth_of_the_fall_by_its_whole_interval():
    from moecache.report.power import plateau

    assert plateau([6.0, 5.9, 5.8, 5.7, 5.6]) is None  # a half of 2 steps
    flat = plateau([5.0 + 0.6**i + 0.003 * (-1) ** i for i in range(40)])
    assert flat.whole.falls and flat.reached
    falling = plateau([6.0 - 0.05 * i + 0.02 * (-1) ** i for i in range(10)])
    assert falling.whole.falls and not falling.reached
    assert falling.steps_needed() > 10
    never = plateau([6.0, 6.1, 5.9, 6.0, 6.1, 5.9, 6.0, 6.0])
    assert not never.whole.falls and not never.reached and never.steps_needed() is None


def test_sizes_that_would_decide():
    from moecache.report.power import (
        about,
        pairs_to_tell_apart,
        questions_to_clear,
        size_to_clear,
        straddles,
    )

    # 1/3 right against chance 1/4: the normal interval's half-width below 1/12.
    assert questions_to_clear(1 / 3, 0.25) == 123 and questions_to_clear(0.25, 0.25) is None
    assert pairs_to_tell_apart(0.5, 0.05) == 385 and pairs_to_tell_apart(0.5, 0) is None
    # Next-use's published 50.1% [47.3, 52.6] on 16 sequences against half the gap.
    assert straddles([0.473, 0.526], 0.5) and not straddles([0.506, 0.59], 0.5)
    assert size_to_clear(16, 0.501, [0.473, 0.526], 0.5) == 12544
    assert size_to_clear(16, 0.45, [0.40, 0.52], 0.5) == 32  # 16 x (0.07 / 0.05)^2, up
    assert about(12544) == "about 12,544" and about(None) == "no size"
