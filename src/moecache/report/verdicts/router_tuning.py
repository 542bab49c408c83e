"""Whether either explanation of Table 3's null result closes the gap: does a router
fine-tuned for cache hits, measured in the harness, reach half the gain its training log
shows? Decided here, on the measurements of `moecache router-measure`, and rendered by the
report (moecache.report.tables.table3). And whether a tuned variant learned at all (its
training series' trend beyond its noise), which the scorecard's router claims need."""

from __future__ import annotations

from dataclasses import dataclass

from moecache.report.power import Trend, trend

TUNED = ("hit", "tag", "harness")  # the variants trained for cache hits
# The per-step series of a variant's training log that shows whether it learned what it
# was trained for: the simulated hit rate at the trained layer and capacity (the `hit`
# reward itself; the `tag` reward counts it at each prompt's tagged size), and for the
# harness variant its reward, minus the harness's copies per token.
LEARNED_SERIES = {"hit": "sim_hit_rate", "tag": "sim_hit_rate", "harness": "reward"}
SERIES_WORDS = {"sim_hit_rate": "simulated hit rate", "reward": "reward (minus copies a token)"}


def learned_trend(log: dict) -> Trend | None:
    """A variant's training log (TuningLog as a dict): the trend of the series it was
    trained to raise, one value a step (None: under 3 steps logged)."""
    key = LEARNED_SERIES[log["variant"]]
    return trend([entry[key] for entry in log["log"] if key in entry])


@dataclass(frozen=True)
class GapVerdict:
    """One fine-tuned variant against the untuned base. Changes are against the base;
    the `*_ref` ones are the reference's (the SFT control when measured, else the base)."""

    model: str
    against_sft: bool
    simulated: float  # the logged simulated hit rate, end minus start
    held: float  # trained-layer hit rate on held-out text
    own: float  # trained-layer hit rate on the model's own generations
    own_ref: float
    lru: float  # LRU's steady copies on held-out text, relative
    lru_ref: float
    logged_copies: float | None  # the harness variant's reward: relative change of copies
    closes: bool | None  # None: the log shows no gain, so there is no gap to close

    @property
    def against(self) -> str:
        return "the SFT control" if self.against_sft else "the base"


def gap_verdicts(found: dict[str, dict]) -> list[GapVerdict]:
    """Per tuned variant with a reward log (router-measure results by model name): whether
    its measured gain reaches half its logged gain, on its own generations (the simulator's
    variants) or on held-out text (the harness-copies variant). Gains are counted beyond
    the SFT control's when it was measured: fine-tuning alone also changes what a model
    generates (and how often it repeats itself)."""
    base = found["base"]
    reference = found.get("sft", base)

    def change(r, text, key, relative=False):
        mine, theirs, untuned = (m[text][key] for m in (r, reference, base))
        if relative:
            return mine / untuned - 1, theirs / untuned - 1
        return mine - untuned, theirs - untuned

    out = []
    for name in TUNED:
        training = (found.get(name) or {}).get("training") or {}
        if not training.get("log_reward"):
            continue
        r, logged = found[name], training["log_sim_hit_rate"]
        simulated = logged["end"] - logged["start"]
        held, _ = change(r, "teacher_forced", "trained_layer_hit_rate")
        own, own_ref = change(r, "own_generations", "trained_layer_hit_rate")
        lru, lru_ref = change(r, "teacher_forced", "lru_steady", relative=True)
        logged_copies, closes = None, None
        if name == "harness":
            reward = training["log_reward"]
            # The reward is minus the copies per token: their relative change in the log.
            logged_copies = reward["end"] / reward["start"] - 1 if reward["start"] else 0.0
            if logged_copies < 0:
                closes = lru - lru_ref <= logged_copies / 2
        elif simulated > 0:
            closes = own - own_ref >= simulated / 2
        out.append(
            GapVerdict(
                name,
                "sft" in found,
                simulated,
                held,
                own,
                own_ref,
                lru,
                lru_ref,
                logged_copies,
                closes,
            )
        )
    return out
