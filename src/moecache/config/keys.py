"""What a study's configuration says, read by its checks and by the stages: how the decode
fans out, which shards and multipliers a run decodes, the model's family, whether the
model is the embedded one; and the error a bad config raises."""

from __future__ import annotations

from moecache.errors import MoecacheError


class ConfigError(MoecacheError):
    """A configuration that cannot describe a valid study."""


# How the decode stage splits into jobs (harness.fan_out): one per shard, every run
# interleaved in it (the default), or one per run x multiplier x shard.
FAN_OUTS = ("shard", "run")


# The exact optimum (replay/optimum.py) holds 2^N resident sets: its sweep takes N <= this.
MAX_EXPERTS = 16


def run_multipliers(run: dict) -> list[int]:
    """A harness run's copy multipliers (the schema's default: [1], the machine's own link)."""
    return run["multipliers"]


def capacity_of(harness: dict, run: dict) -> int:
    """A run's device slots per restricted layer: its own `capacity`, else harness.capacity."""
    return run.get("capacity", harness["capacity"])


def run_shards(run: dict, config: dict) -> list[str]:
    """The held-out shards a harness run decodes: its `shards`, by default every held-out
    shard of `config`. The one place the default is written; everything reads it here."""
    return run.get("shards", list(config["corpus"]["heldout"]["shards"]))


def run_decodes_shard(run: dict, shard: str) -> bool:
    """Whether a harness run decodes `shard`, for a job that knows its own shard but not the
    corpus (a decode job's settings hold model and harness only): run_shards' default,
    every shard, includes it."""
    return shard in run_shards(run, {"corpus": {"heldout": {"shards": [shard]}}})


def fan_out(config: dict) -> str:
    """harness.fan_out; anything but FAN_OUTS refuses with one line."""
    mode = config["harness"]["fan_out"]
    if mode not in FAN_OUTS:
        raise ConfigError(
            f"config key harness.fan_out: {mode!r} is not one of {', '.join(FAN_OUTS)}"
        )
    return mode


def family(config: dict) -> str:
    """The model family (transformers' model_type)."""
    return config["model"]["family"]


def embedded(config: dict) -> bool:
    return config["model"]["source"] == "embedded"
