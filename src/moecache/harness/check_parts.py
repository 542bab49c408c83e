"""The GPU check's parts (gpu_check.py), run one by one within its budget (`Parts`): the
smoke model saved and loaded per dtype (what the device holds while pooled, then the gates,
below float32 with the tolerance its own rounding sets), copy bandwidth of its experts, the
paper-sized layer, the paper-shaped models (paper_check.py) and every other family's tiny
model; `measure_device` runs them all and assembles the report, each part's log line
beside it."""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
import traceback
from pathlib import Path

import torch

from moecache import provenance
from moecache.errors import first_line
from moecache.harness import bandwidth, gates, nll, paper_check
from moecache.harness.check_models import (
    family_model,
    float32_copy,
    paper_experts,
    smoke_model,
    smoke_sequences,
)
from moecache.harness.check_sizes import (
    BUDGET_S,
    ESTIMATE_S,
    FAMILY_SEQUENCES,
    Sizes,
    settings_of,
    smoke_sizes,
)
from moecache.harness.pooled_memory import pooled_memory
from moecache.model import registry

# A lower precision's teacher-forced and batched NLLs are two roundings of one value, each
# about as far from it as the batched NLL lies from the same weights computed in float32:
# they may differ by twice that (docs/gpu-check.md).
ROUNDING_FACTOR = 2.0


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
        exact = nll.batched_nll(float32_copy(model), ids, harness["device"])
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
