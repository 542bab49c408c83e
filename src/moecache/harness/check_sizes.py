"""What the GPU check (gpu_check.py) builds and measures, and within what time: the smoke
model's and harness's sizes (config/smoke.yaml's, a GPU's harness over them), the copy
figures', the paper-sized layer's and the paper-shaped models' sizes, the budget and each
part's estimate (`Sizes`, `smoke_sizes`), and the settings that describe the check's
results (`settings_of`)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from moecache import config as configs
from moecache.harness import paper_check
from moecache.harness.check_models import SCALE
from moecache.model import registry

SMOKE_CONFIG = Path(__file__).resolve().parents[3] / "config" / "smoke.yaml"

SEED = 0
# The smoke harness settings the check reads from config/smoke.yaml, and what it holds a
# GPU to beyond them (the smoke file's own are for seconds-scale runs on a shared CPU): a
# warm-up and a ring as a run's; the throughput floor and gate passes are the schema's
# defaults, filled in with the rest.
SMOKE_HARNESS_KEYS = ("restricted_layers", "capacity", "threads", "trace_run", "probe")
GPU_HARNESS = {"warmup_tokens": 8, "link_ring_mib": 64, "runs": {"lru": {"policy": "lru"}}}
SEQUENCES, TOKENS = 8, 128  # enough tokens that the pooled/own ratio is told from 0.95
DTYPES = ("float32", "bfloat16")
# The other families with an adapter, each a tiny model through the gates (the smoke model
# is the OLMoE), on the first FAMILY_SEQUENCES sequences.
FAMILIES = tuple(sorted(set(registry.ADAPTERS) - {"olmoe"}))
FAMILY_SEQUENCES = 2
MULTIPLIERS = (1, 10, 50)
RING_MIB = 128
ROUNDS = 15
# One layer of OLMoE-1B-7B's experts, as the paper prices them.
PAPER_LAYER = {
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "dtype": "bfloat16",
}
PAPER_MULTIPLIERS = (1, 10)
PAPER_RING_MIB = 256
# The paper-shaped models (paper_check.py) and their pace: a few short sequences, enough
# tokens for a bootstrap interval on ms per token, two timed passes.
PAPER_MODELS = paper_check.PAPER_MODELS
PAPER_PACE = {"sequences": 4, "tokens": 40, "warmup_tokens": 4, "repeats": 2}
# The whole check within 8 minutes on one GPU: a part that would end past BUDGET_S (the
# seconds so far plus its estimate) is skipped, and the results file says so.
BUDGET_S = 480
# Each part's seconds on one H100, from the committed H200 run's log and, for the new
# parts, from their sizes (pinned copies at ~50 GiB/s: 0.25 ms an OLMoE expert of 12.6 MB).
ESTIMATE_S = {
    # smoke gates in one dtype: 60 s on the H200 (8 x 128 tokens token by token, the own
    # block and the pool at C = N over 3 passes, then 3 lossless runs); load and memory <1 s
    "gates": 75,
    # one family in one dtype: its tiny model built and saved, 2 of those 8 sequences
    "family": 20,
    "bandwidth": 10,  # 6 s on the H200
    "paper layer": 20,  # 15 s on the H200 (64 experts of 12 MiB, 15 rounds x 2 multipliers)
    # OLMoE at 4 layers: 1.9 G bfloat16 weights drawn on the GPU (~1 s) and saved (3.8 GB,
    # ~10 s), read, the experts of 2 layers pinned and the rest moved (~10 s); gates on
    # 4 x 40 tokens, 6 arms (~15 s); decode: 3 runs x 160 tokens x 2 passes at 1x (~6 ms
    # a token: ~6 s), then 3 groups of a 1x twin and a 10x run, in lockstep: ~9.5 copies
    # a token (LRU at C = 32 of 64 on random routing, as a CPU run at these shapes
    # counted) x 2.5 ms = ~24 ms a token more at 10x: ~35 s
    "paper olmoe": 110,
    # GPT-OSS at 2 layers: 1.85 G weights drawn on the GPU and saved (3.5 GB, ~10 s),
    # read back onto it and its 64 experts quantized to MXFP4 there (~5 s), written
    # (1.9 GB, ~5 s); read with layer 0 dequantized by transformers on the host (~15 s);
    # gates and LRU at 1x on one offloaded layer of 13 MB experts (~15 s)
    "paper gpt_oss": 80,
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the check builds and measures; `arch`, `vocab`, `harness` and the experts'
    kernel default to config/smoke.yaml's (`smoke_sizes`)."""

    arch: dict
    vocab: int
    harness: dict
    experts_implementation: str
    sequences: int = SEQUENCES
    tokens: int = TOKENS
    dtypes: tuple = DTYPES
    multipliers: tuple = MULTIPLIERS
    ring_mib: int = RING_MIB
    rounds: int = ROUNDS
    paper: dict = dataclasses.field(default_factory=lambda: dict(PAPER_LAYER))
    paper_multipliers: tuple = PAPER_MULTIPLIERS
    paper_ring_mib: int = PAPER_RING_MIB
    seed: int = SEED
    families: tuple = FAMILIES
    paper_models: dict = dataclasses.field(default_factory=lambda: dict(PAPER_MODELS))
    paper_pace: dict = dataclasses.field(default_factory=lambda: dict(PAPER_PACE))
    budget_s: float = BUDGET_S


def smoke_sizes(
    device: str, *, arch=None, vocab=None, harness=None, paper=None, tokens=TOKENS, **rest
) -> Sizes:
    """The check's sizes on `device`: config/smoke.yaml's model and harness (read with the
    project's config loader), GPU_HARNESS over its harness, then the given overrides."""
    smoke = configs.load(SMOKE_CONFIG)
    arch = dict(arch or smoke["model"]["architecture"])
    arch["max_position_embeddings"] = max(arch["max_position_embeddings"], tokens)
    own = {key: smoke["harness"][key] for key in SMOKE_HARNESS_KEYS}
    harness = {**copy.deepcopy(own), **GPU_HARNESS, **(harness or {}), "device": device}
    harness = configs.with_defaults(harness, "harness")
    ordered = {
        k: tuple(sorted(set(rest[k]))) for k in ("multipliers", "paper_multipliers") if k in rest
    }
    return Sizes(
        arch=arch,
        vocab=vocab or smoke["tokenizer"]["vocab_size"],
        harness=harness,
        experts_implementation=smoke["model"]["experts_implementation"],
        paper={**PAPER_LAYER, **(paper or {})},
        tokens=tokens,
        **{**rest, **ordered},
    )


def settings_of(sizes: Sizes) -> dict:
    """The settings that describe a check's results (its settings hash)."""
    return {
        "seed": sizes.seed,
        "model": {
            "source": "random init, seeded (not trained)",
            "architecture": sizes.arch,
            "vocab_size": sizes.vocab,
            "scale": SCALE,
            "experts_implementation": sizes.experts_implementation,
            "dtypes": list(sizes.dtypes),
            "families": list(sizes.families),
        },
        "sequences": {
            "count": sizes.sequences,
            "tokens": sizes.tokens,
            "source": "uniform random ids",
        },
        "harness": sizes.harness,
        "bandwidth": {
            "multipliers": list(sizes.multipliers),
            "ring_mib": sizes.ring_mib,
            "rounds": sizes.rounds,
        },
        "paper_layer": {
            **sizes.paper,
            "multipliers": list(sizes.paper_multipliers),
            "ring_mib": sizes.paper_ring_mib,
        },
        "paper_models": {
            "models": {name: dataclasses.asdict(m) for name, m in sizes.paper_models.items()},
            "pace": sizes.paper_pace,
            "slow_multiplier": paper_check.SLOW_MULTIPLIER,
        },
        "budget_s": sizes.budget_s,
    }
