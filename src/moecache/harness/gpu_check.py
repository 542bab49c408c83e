"""`make gpu-check`: the harness on one CUDA device in under 8 minutes, nothing downloaded.

Its parts, each recorded in one results file (a part that raises is recorded with its
error and the others still run; a part whose estimate would take the check past BUDGET_S
is skipped and recorded so), in this order:

- the smoke-sized OLMoE (config/smoke.yaml's architecture and vocabulary), built in memory
  from a seeded random init (experts and output head scaled up as in the harness tests, so
  that which expert computes a token visibly moves the NLL), saved and loaded through the
  pipeline's own loading path in float32 and in bfloat16, through the exactness and
  throughput gates; in bfloat16 the teacher-forced-against-batched gate takes a tolerance
  derived from bfloat16's own rounding of the same model (docs/gpu-check.md);
- per dtype, what the device holds while the restricted layers are pooled: their own
  expert weights leave the device, the other weights and C slots per restricted layer
  stay (and the link's ring), against torch.cuda.memory_allocated;
- copy bandwidth of the smoke model's experts at each copy multiplier;
- a paper-sized synthetic expert layer (OLMoE-1B-7B's: hidden 2048, intermediate 1024,
  64 experts, bfloat16): time per expert copy and GiB/s of the per-expert loop against
  one large copy of the same bytes. Its figures are repeated at the file's top level
  (`tau_ms`, `loop_gib_per_s`, `large_gib_per_s`), where a bandwidth file keeps them;
- paper-shaped models (paper_check.py): OLMoE-1B-7B at 4 layers and a GPT-OSS-20B at 2
  with MXFP4 experts, loaded by jobs.load_model through the gates and decode jobs: each
  job's accountant peaks against torch.cuda.max_memory_allocated and the plan (more than
  5% off the plan fails), and LRU blocking against overlapped copies at 1x and 10x;
- every other family's tiny model through the same gates.

`run` refuses in one line without CUDA; it writes the results file and then refuses in
one line, naming them, when a part raised, a gate failed or the accountant left the plan.
`measure_device` and `finish` do the work on any device (the tests call them on the CPU at
reduced sizes).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

from moecache import config as configs
from moecache import provenance
from moecache.errors import MoecacheError, first_line
from moecache.harness import bandwidth, decode, gates, paper_check
from moecache.harness.check_models import (
    SCALE,
    family_model,
    float32_copy,
    paper_experts,
    smoke_model,
    smoke_sequences,
)
from moecache.harness.pooled_memory import pooled_memory
from moecache.model import registry

NO_CUDA = "no CUDA device: make gpu-check needs one (torch.cuda.is_available() is False)"
SMOKE_CONFIG = Path(__file__).resolve().parents[3] / "config" / "smoke.yaml"

SEED = 0
# The smoke harness settings the check reads from config/smoke.yaml, and what it holds a
# GPU to beyond them (the smoke file's own are for seconds-scale runs on a shared CPU):
# the embedded default's throughput floor and gate passes, a warm-up and a ring as a run's.
SMOKE_HARNESS_KEYS = ("restricted_layers", "capacity", "threads", "trace_run", "probe")
GPU_HARNESS = {
    "warmup_tokens": 8,
    "gate_repeats": gates.GATE_REPEATS,
    "link_ring_mib": 64,
    "min_throughput_ratio": gates.MIN_THROUGHPUT_RATIO,
    "runs": {"lru": {"policy": "lru"}},
}
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
# A lower precision's teacher-forced and batched NLLs are two roundings of one value, each
# about as far from it as the batched NLL lies from the same weights computed in float32:
# they may differ by twice that (docs/gpu-check.md).
ROUNDING_FACTOR = 2.0


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


def smoke_sizes(device: str, *, arch=None, vocab=None, harness=None, paper=None, **rest) -> Sizes:
    """The check's sizes on `device`: config/smoke.yaml's model and harness (read with the
    project's config loader), GPU_HARNESS over its harness, then the given overrides."""
    smoke = configs.load(SMOKE_CONFIG)
    arch = dict(arch or smoke["model"]["architecture"])
    tokens = rest.get("tokens", TOKENS)
    arch["max_position_embeddings"] = max(arch["max_position_embeddings"], tokens)
    own = {key: smoke["harness"][key] for key in SMOKE_HARNESS_KEYS}
    harness = {**copy.deepcopy(own), **GPU_HARNESS, **(harness or {}), "device": device}
    ordered = {
        k: tuple(sorted(set(rest[k]))) for k in ("multipliers", "paper_multipliers") if k in rest
    }
    return Sizes(
        arch=arch,
        vocab=vocab or smoke["tokenizer"]["vocab_size"],
        harness=harness,
        experts_implementation=smoke["model"]["experts_implementation"],
        paper={**PAPER_LAYER, **(paper or {})},
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


def cuda_device(device: str) -> torch.device:
    """The CUDA device named by `device` (with its index), or one line saying why not."""
    with warnings.catch_warnings():  # a CUDA build without a driver warns on stderr
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available()
    if not available:
        raise MoecacheError(NO_CUDA)
    try:
        found = torch.device(device)
    except RuntimeError:
        raise MoecacheError(f"--device {device}: not a device name (cuda or cuda:N)") from None
    if found.type != "cuda":
        raise MoecacheError(f"--device {device}: gpu-check runs on a CUDA device (cuda or cuda:N)")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if found.index is None else found.index
    if not 0 <= index < count:
        raise MoecacheError(f"--device {device}: this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)


def run(out_path, device: str = "cuda", log=None, **sizes) -> dict:
    """The check on one CUDA device; writes `out_path` (JSON), then refuses if anything
    failed. `sizes`: smoke_sizes' overrides."""
    log = log or say
    dev = cuda_device(device)
    torch.cuda.set_device(dev)  # current device = dev: its current stream, its allocator
    log(f"gpu-check on {dev} ({torch.cuda.get_device_name(dev)})")
    report, settings = measure_device(str(dev), log=log, **sizes)
    return finish(out_path, report, settings, str(dev), log)


def finish(out_path, report: dict, settings: dict, device: str, log=None) -> dict:
    """Write the results file; then, where a part raised or a gate failed, one line naming
    each (MoecacheError: the command exits non-zero)."""
    log = log or say
    provenance.write_results(out_path, report, settings, device)
    for line in summary(report):
        log(line)
    log(f"wrote {out_path} in {report['seconds']:.0f} s")
    raised = [f"{name} raised ({e['error']})" for name, e in report["errors"].items()]
    problems = raised + failed_gates(report) + off_the_plan(report)
    if problems:
        raise MoecacheError(f"gpu-check failed: {'; '.join(problems)}; all in {out_path}")
    return report


def failed_gates(report: dict) -> list[str]:
    """Every failed gate, named by its model and dtype."""
    found = []
    for label, result in gate_results(report):
        found += [f"gate {label}: {failure}" for failure in result.get("failures", [])]
    return found


def off_the_plan(report: dict) -> list[str]:
    """Every paper-shaped job whose accountant's peak is more than 5% off the plan's."""
    found = []
    for name, result in report.get("paper_models", {}).items():
        if "memory" in result:
            found += paper_check.memory_failures(f"paper {name}", result["memory"])
    return found


def gate_results(report: dict):
    """(label, gates report) of the smoke model per dtype, then of every other family."""
    yield from report["gates"].items()
    for family, by_dtype in report.get("families", {}).items():
        for dtype, result in by_dtype.items():
            yield f"{family} {dtype}", result


def say(line: str) -> None:
    print(line, flush=True)


class Parts:
    """The check's parts, run one by one: a part that raises is recorded with its error
    (and traceback) and the next part runs; a part that would end past `budget_s` (the
    seconds so far and its estimate) is skipped, and recorded so."""

    def __init__(self, device: str, log, budget_s: float = BUDGET_S):
        self.device, self.log, self.budget_s = device, log, budget_s
        self.errors: dict[str, dict] = {}
        self.skipped: dict[str, str] = {}
        self.started = time.perf_counter()

    def step(self, name: str, work, estimate_s: float = 0):
        """A part's result, or None with its error or its skipping recorded."""
        elapsed = time.perf_counter() - self.started
        if elapsed + estimate_s > self.budget_s:
            self.skipped[name] = (
                f"skipped: {elapsed:.0f} s so far and about {estimate_s:.0f} s for it would "
                f"pass the {self.budget_s:.0f} s budget"
            )
            self.log(f"[{elapsed:6.1f} s] {name} {self.skipped[name]}")
            return None
        self.log(f"[{elapsed:6.1f} s] {name} ...")
        try:
            return work()
        except Exception as error:  # noqa: BLE001  (recorded in the results, not lost)
            self.errors[name] = {"error": f"{type(error).__name__}: {first_line(error)}"}
            self.errors[name]["traceback"] = traceback.format_exc()
            self.log(f"  {name} raised {self.errors[name]['error']}")
            return None
        finally:
            release(self.device)

    def recorded(self, name: str, work, estimate_s: float = 0) -> dict:
        """A part's result, or its error where it raised, or why it was skipped."""
        result = self.step(name, work, estimate_s)
        return self.missing(name) if result is None else result

    def missing(self, name: str) -> dict:
        """Why a part has no result: {"error": ...} or {"skipped": ...}."""
        if name in self.skipped:
            return {"skipped": self.skipped[name]}
        return {"error": self.errors[name]["error"]}


def measure_device(device: str, *, log=say, **overrides) -> tuple[dict, dict]:
    """Every part on `device`; returns the report and the settings that describe it.
    `overrides`: smoke_sizes' (reduced sizes in the tests)."""
    sizes = smoke_sizes(device, **overrides)
    parts = Parts(device, log, sizes.budget_s)
    # In order of what the check is for, so that the budget skips the last: the smoke
    # gates, the copy figures of Table 1's device row, the paper-shaped models, then the
    # other families.
    with tempfile.TemporaryDirectory(prefix="moecache-gpu-check-") as folder:
        model, ids = smoke_model_saved(sizes, Path(folder) / "model")
        smoke = {
            dtype: dtype_part(parts, Path(folder) / "model", dtype, sizes, ids)
            for dtype in sizes.dtypes
        }
        smoke_bandwidth = bandwidth_part(parts, model, sizes)
        del model
        paper_bandwidth = parts.step(
            "paper layer", lambda: paper_layer_part(sizes, device), ESTIMATE_S["paper layer"]
        )
        if paper_bandwidth is not None:
            log(bandwidth_line("paper layer", paper_bandwidth))
        paper_models = {
            name: paper_model_part(parts, name, m, sizes) for name, m in sizes.paper_models.items()
        }
        families = {
            family: family_part(parts, Path(folder) / family, family, sizes, ids[:FAMILY_SEQUENCES])
            for family in sizes.families
        }
    report = assemble(device, smoke, smoke_bandwidth, paper_bandwidth, parts)
    report["paper_models"] = paper_models
    report["families"] = {
        f: {d: gates_of for d, (gates_of, _) in r.items()} for f, r in families.items()
    }
    return report, settings_of(sizes)


def paper_model_part(parts: Parts, name: str, model, sizes: Sizes) -> dict:
    """A paper-shaped model through the real loading, gates and decode (paper_check.py),
    each stage a part of its own (one that raises is recorded and fails the check); the
    budget asks for the whole model's estimate before it is written."""
    return parts.recorded(
        f"paper {name}",
        lambda: paper_check.measure(
            name, model, parts.device, sizes.paper_pace, sizes.seed, parts.log, parts.step
        ),
        ESTIMATE_S.get(f"paper {name}", ESTIMATE_S["paper olmoe"]),
    )


def smoke_model_saved(sizes: Sizes, saved: Path):
    """The smoke model (kept on the host for the bandwidth part), saved to `saved`, and the
    check's token sequences."""
    model = smoke_model(sizes.arch, sizes.vocab, sizes.seed)
    model.save_pretrained(saved)
    return model, smoke_sequences(sizes.vocab, sizes.sequences, sizes.tokens, sizes.seed)


def dtype_part(parts: Parts, saved: Path, dtype: str, sizes: Sizes, ids, label=None, estimate=None):
    """The saved model loaded in `dtype` onto the device as the pipeline loads it: what the
    device holds while pooled, then the gates. `label`: the parts' names (the dtype);
    `estimate`: the seconds of all three, checked against the budget before the load."""
    from moecache.model import checkpoint

    label, harness = label or dtype, sizes.harness
    with threads(harness["threads"]):
        model = parts.step(
            f"load {label}",
            lambda: checkpoint.load(
                saved, dtype, harness["device"], sizes.arch, sizes.experts_implementation
            ),
            ESTIMATE_S["gates"] if estimate is None else estimate,
        )
        if model is None:
            failed = parts.missing(f"load {label}")
            return failed, failed
        held = parts.recorded(
            f"memory {label}",
            lambda: pooled_memory(
                model,
                harness["restricted_layers"],
                harness["capacity"],
                harness["device"],
                harness["link_ring_mib"],
            ),
        )
        report = parts.recorded(
            f"gates {label}", lambda: gates_report(model, ids, harness, sizes.seed)
        )
    if "error" not in report and "error" not in held:
        parts.log(gate_line(label, report, held))
    return report, held


def family_part(parts: Parts, saved: Path, family: str, sizes: Sizes, ids) -> dict:
    """Another family's tiny model through the same gates, per dtype: {dtype: (gates, memory)}."""
    estimate = ESTIMATE_S["family"]
    built = parts.step(
        f"build {family}",
        lambda: family_model(family, sizes.arch, sizes.vocab, sizes.seed, saved),
        estimate * len(sizes.dtypes),
    )
    if built is None:
        missing = parts.missing(f"build {family}")
        return {dtype: (missing, missing) for dtype in sizes.dtypes}
    return {
        dtype: dtype_part(parts, saved, dtype, sizes, ids, f"{family} {dtype}", estimate)
        for dtype in sizes.dtypes
    }


def bandwidth_part(parts: Parts, model, sizes: Sizes) -> dict | None:
    """As `moecache bandwidth`: the copies rotate over every restricted layer's experts."""
    adapter = registry.of(model)
    experts = [adapter.layer_experts(model, layer) for layer in sizes.harness["restricted_layers"]]
    measured = parts.step(
        "bandwidth",
        lambda: bandwidth.measure(
            experts, parts.device, list(sizes.multipliers), sizes.ring_mib, sizes.rounds
        ),
        ESTIMATE_S["bandwidth"],
    )
    if measured is not None:
        parts.log(bandwidth_line("smoke experts", measured))
    return measured


def assemble(device, smoke: dict, smoke_bandwidth, paper_bandwidth, parts: Parts) -> dict:
    """The results file's numbers; the paper layer's copy figures also at the top level."""
    report = {
        "device_name": provenance.device_name(device),
        "device_row": "paper_layer",
        "tau_ms": None,
        "loop_gib_per_s": None,
        "large_gib_per_s": None,
        "expert_bytes": None,
        "gates": {dtype: gates_of for dtype, (gates_of, _) in smoke.items()},
        "memory": {dtype: held for dtype, (_, held) in smoke.items()},
        "bandwidth": smoke_bandwidth,
        "paper_layer": paper_bandwidth,
        "errors": parts.errors,
        "skipped": parts.skipped,
        "seconds": time.perf_counter() - parts.started,
    }
    if paper_bandwidth is not None:
        for key in ("tau_ms", "loop_gib_per_s", "large_gib_per_s", "expert_bytes"):
            report[key] = paper_bandwidth[key]
    return report


@contextlib.contextmanager
def threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gates_report(model, ids, harness: dict, seed: int) -> dict:
    """The gates on `model`; below float32 the teacher-forced-against-batched gate holds to
    the tolerance its own rounding sets (`rounding_tolerance`)."""
    torch.manual_seed(seed)
    report = gates.run(model, ids, harness, seed)
    if next(model.parameters()).dtype != torch.float32:
        exact = decode.batched_nll(float32_copy(model), ids, harness["device"])
        report.update(rounding_tolerance(report["batched_nll"], exact))
        report["failures"] = gates.failures(report)
    report["passed"] = not report["failures"]
    return report


def rounding_tolerance(batched_nll: float, float32_nll: float) -> dict:
    """The teacher-forced-against-batched tolerance of a lower precision: ROUNDING_FACTOR
    times how far its rounding moves the batched NLL from the same weights computed in
    float32, never below float32's own tolerance (docs/gpu-check.md)."""
    rounding = abs(batched_nll - float32_nll)
    return {
        "batched_float32_nll": float32_nll,
        "rounding_nll": rounding,
        "batched_tolerance": max(gates.BATCHED_TOLERANCE, ROUNDING_FACTOR * rounding),
    }


def paper_layer_part(sizes: Sizes, device: str) -> dict:
    experts = paper_experts(sizes.paper, sizes.seed, sizes.experts_implementation)
    multipliers = list(sizes.paper_multipliers)
    result = bandwidth.measure([experts], device, multipliers, sizes.paper_ring_mib, sizes.rounds)
    result["layer"] = {
        **sizes.paper,
        "gate_up_proj": list(experts.gate_up_proj.shape),
        "down_proj": list(experts.down_proj.shape),
        "layer_bytes": result["expert_bytes"] * result["experts"],
    }
    return result


def release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def gate_line(dtype: str, report: dict, held: dict) -> str:
    low, high = report["throughput_ratio_ci"]
    verdict = "passed" if report["passed"] else f"{len(report['failures'])} failed"
    line = (
        f"  gates {dtype}: {verdict}; base NLL {report['base']['nll']:.5f}, batched "
        f"{report['batched_nll']:.5f}; pooled/own tokens/s "
        f"{report['throughput_ratio_pool_vs_own_block']:.3f} (95% {low:.3f}-{high:.3f}); "
        f"held {held['held_bytes'] / 2**20:.2f} MiB"
    )
    if "allocated_pooled_bytes" in held:
        line += f" (allocated {held['allocated_pooled_bytes'] / 2**20:.2f} MiB)"
    return line


def bandwidth_line(what: str, r: dict) -> str:
    rows = ", ".join(
        f"x{m} {row['tau_ms']:.4f} ms ({row['ratio_to_1x']:.1f}x)"
        for m, row in r["multipliers"].items()
    )
    return (
        f"  {what}: {r['expert_bytes'] / 2**20:.3f} MiB per expert; tau {rows}; loop "
        f"{r['loop_gib_per_s']:.2f} GiB/s, one large copy {r['large_gib_per_s']:.2f} GiB/s"
    )


def summary(report: dict) -> list[str]:
    lines = [f"device: {report['device_name']}"]
    for dtype, r in report["gates"].items():
        if "error" in r:
            lines.append(f"gates {dtype}: raised {r['error']}")
        elif "skipped" in r:
            lines.append(f"gates {dtype}: {r['skipped']}")
        else:
            lines.extend(f"gates {dtype}: {failure}" for failure in r["failures"])
            lines.append(f"gates {dtype}: {'passed' if r['passed'] else 'FAILED'}")
    if report["tau_ms"] is not None:
        lines.append(
            f"device row (paper layer): tau {report['tau_ms']:.4f} ms, loop "
            f"{report['loop_gib_per_s']:.2f} GiB/s, one large copy "
            f"{report['large_gib_per_s']:.2f} GiB/s"
        )
    for name, result in report.get("paper_models", {}).items():
        for job, held in result.get("memory", {}).items():
            lines.append(paper_check.memory_line(f"paper {name} {job}", held).strip())
        lines += [
            f"paper {name} {line}" for line in paper_check.overlap_lines(result.get("overlap", {}))
        ]
    lines += [f"{name}: {why}" for name, why in report.get("skipped", {}).items()]
    return lines
