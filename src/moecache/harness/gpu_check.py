"""`make gpu-check`: the harness on one CUDA device in minutes, nothing downloaded.

Four parts, each recorded in one results file (a part that raises is recorded with its
error and the others still run):

- the smoke-sized OLMoE, built in memory from a seeded random init (experts and output
  head scaled up as in the harness tests, so that which expert computes a token visibly
  moves the NLL), saved and loaded through the pipeline's own loading path in float32 and
  in bfloat16, through the exactness and throughput gates (failures recorded, not raised:
  the NLL tolerances are float32's and need not hold in bfloat16);
- per dtype, what the device holds while the restricted layers are pooled: their own
  expert weights leave the device, the other weights and C slots per restricted layer
  stay (and the link's ring), against torch.cuda.memory_allocated;
- copy bandwidth of the smoke model's experts at each copy multiplier;
- a paper-sized synthetic expert layer (OLMoE-1B-7B's: hidden 2048, intermediate 1024,
  64 experts, bfloat16): time per expert copy and GiB/s of the per-expert loop against
  one large copy of the same bytes. Its figures are repeated at the file's top level
  (`tau_ms`, `loop_gib_per_s`, `large_gib_per_s`), where a bandwidth file keeps them.

`run` refuses in one line without CUDA; `measure_device` does the work on any device
(the tests call it on the CPU at reduced sizes).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

from moecache import provenance
from moecache.errors import MoecacheError, first_line
from moecache.harness import bandwidth, decode, gates
from moecache.model import plan, registry

NO_CUDA = "no CUDA device: make gpu-check needs one (torch.cuda.is_available() is False)"

SEED = 0
# config/smoke.yaml's model.architecture and tokenizer.vocab_size.
SMOKE_ARCH = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "max_position_embeddings": 64,
}
VOCAB = 512
EXPERTS_IMPLEMENTATION = "per-expert"
# As the harness tests' smoke fixture: without it a random model's logits hardly depend on
# which experts computed the token, and the exactness gates would test nothing.
SCALE = {"gate_up_proj": 20.0, "down_proj": 50.0, "lm_head": 20.0}
SEQUENCES, TOKENS = 8, 128  # enough tokens that the pooled/own ratio is told from 0.95
DTYPES = ("float32", "bfloat16")
# The other families with an adapter, each a tiny model through the gates (the smoke model
# is the OLMoE), on the first FAMILY_SEQUENCES sequences.
FAMILIES = tuple(sorted(set(registry.ADAPTERS) - {"olmoe"}))
FAMILY_SEQUENCES = 2
HARNESS = {
    "restricted_layers": [1, 2],
    "capacity": 8,
    "threads": 1,
    "warmup_tokens": 8,
    "trace_run": "lru",
    "probe": {"k": 4, "window": 8},
    "runs": {"lru": {"policy": "lru"}},
    "repeats": 3,
    "link_ring_mib": 64,
    "min_throughput_ratio": 0.95,
}
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
    """The check on one CUDA device; writes `out_path` (JSON). `sizes`: measure_device's."""
    log = log or say
    dev = cuda_device(device)
    torch.cuda.set_device(dev)  # current device = dev: its current stream, its allocator
    name = torch.cuda.get_device_name(dev)
    log(f"gpu-check on {dev} ({name})")
    report, settings = measure_device(str(dev), log=log, **sizes)
    provenance.write_results(out_path, report, settings, str(dev))
    for line in summary(report):
        log(line)
    log(f"wrote {out_path} in {report['seconds']:.0f} s")
    if report["errors"]:
        raise MoecacheError(
            f"gpu-check: {', '.join(report['errors'])} raised "
            f"({'; '.join(e['error'] for e in report['errors'].values())}); "
            f"the rest is in {out_path}"
        )
    return report


def say(line: str) -> None:
    print(line, flush=True)


def measure_device(
    device: str,
    *,
    arch: dict | None = None,
    vocab: int = VOCAB,
    sequences: int = SEQUENCES,
    tokens: int = TOKENS,
    dtypes=DTYPES,
    harness: dict | None = None,
    multipliers=MULTIPLIERS,
    ring_mib: int = RING_MIB,
    rounds: int = ROUNDS,
    paper: dict | None = None,
    paper_multipliers=PAPER_MULTIPLIERS,
    paper_ring_mib: int = PAPER_RING_MIB,
    seed: int = SEED,
    log=say,
    families=FAMILIES,
) -> tuple[dict, dict]:
    """Every part on `device`; returns the report and the settings that describe it."""
    arch = dict(arch or SMOKE_ARCH)
    arch["max_position_embeddings"] = max(arch["max_position_embeddings"], tokens)
    harness = {**copy.deepcopy(HARNESS), **(harness or {}), "device": device}
    paper = {**PAPER_LAYER, **(paper or {})}
    multipliers, paper_multipliers = sorted(set(multipliers)), sorted(set(paper_multipliers))
    settings = {
        "seed": seed,
        "model": {
            "source": "random init, seeded (not trained)",
            "architecture": arch,
            "vocab_size": vocab,
            "scale": SCALE,
            "experts_implementation": EXPERTS_IMPLEMENTATION,
            "dtypes": list(dtypes),
            "families": list(families),
        },
        "sequences": {"count": sequences, "tokens": tokens, "source": "uniform random ids"},
        "harness": harness,
        "bandwidth": {"multipliers": multipliers, "ring_mib": ring_mib, "rounds": rounds},
        "paper_layer": {**paper, "multipliers": paper_multipliers, "ring_mib": paper_ring_mib},
    }
    started = time.perf_counter()
    errors: dict[str, dict] = {}

    def step(name, work):
        """One part: its result, or None with the error recorded (and the next part runs)."""
        log(f"[{time.perf_counter() - started:6.1f} s] {name} ...")
        try:
            return work()
        except Exception as error:  # noqa: BLE001  (recorded in the results, not lost)
            errors[name] = {"error": f"{type(error).__name__}: {first_line(error)}"}
            errors[name]["traceback"] = traceback.format_exc()
            log(f"  {name} raised {errors[name]['error']}")
            return None
        finally:
            release(device)

    def recorded(name, work):
        """A part's result, or its error where it raised."""
        result = step(name, work)
        return {"error": errors[name]["error"]} if result is None else result

    def dtype_part(saved, dtype, arch, ids, harness, label=None):
        """The saved model loaded in `dtype` onto the device as the pipeline loads it: what
        the device holds while pooled, then the gates (recorded, not checked). `label`:
        the parts' names (default: the dtype)."""
        label = label or dtype
        from moecache.model import checkpoint

        device = harness["device"]
        model = step(
            f"load {label}",
            lambda: checkpoint.load(saved, dtype, device, arch, EXPERTS_IMPLEMENTATION),
        )
        if model is None:
            failed = {"error": errors[f"load {label}"]["error"]}
            return failed, failed
        held = recorded(
            f"memory {label}",
            lambda: pooled_memory(
                model,
                harness["restricted_layers"],
                harness["capacity"],
                device,
                harness["link_ring_mib"],
            ),
        )
        report = recorded(f"gates {label}", lambda: gates_report(model, ids, harness, seed))
        if "error" not in report and "error" not in held:
            log(gate_line(label, report, held))
        return report, held

    gate_reports, memory, family_gates = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="moecache-gpu-check-") as folder:
        saved = Path(folder) / "model"
        model = smoke_model(arch, vocab, seed)
        model.save_pretrained(saved)
        ids = smoke_sequences(vocab, sequences, tokens, seed)
        for dtype in dtypes:
            with threads(harness["threads"]):
                gate_reports[dtype], memory[dtype] = dtype_part(saved, dtype, arch, ids, harness)
        # Every other family's tiny model through the same gates, on fewer sequences.
        for family in families:
            saved = Path(folder) / family
            step(f"build {family}", lambda f=family, s=saved: family_model(f, arch, vocab, seed, s))
            for dtype in dtypes:
                with threads(harness["threads"]):
                    gates_of, _ = dtype_part(
                        saved, dtype, arch, ids[:FAMILY_SEQUENCES], harness, f"{family} {dtype}"
                    )
                family_gates.setdefault(family, {})[dtype] = gates_of
    # As `moecache bandwidth`: the copies rotate over every restricted layer's experts.
    adapter = registry.of(model)
    experts = [adapter.layer_experts(model, layer) for layer in harness["restricted_layers"]]
    smoke_bandwidth = step(
        "bandwidth",
        lambda e=experts: bandwidth.measure(e, device, multipliers, ring_mib, rounds),
    )
    del model, experts
    if smoke_bandwidth is not None:
        log(bandwidth_line("smoke experts", smoke_bandwidth))
    paper_bandwidth = step(
        "paper layer",
        lambda: paper_layer_part(paper, device, paper_multipliers, paper_ring_mib, rounds, seed),
    )
    if paper_bandwidth is not None:
        log(bandwidth_line("paper layer", paper_bandwidth))
    report = assemble(
        device, gate_reports, memory, smoke_bandwidth, paper_bandwidth, errors, started
    )
    report["families"] = family_gates
    return report, settings


def assemble(device, gate_reports, memory, smoke_bandwidth, paper_bandwidth, errors, started):
    """The results file's numbers; the paper layer's copy figures also at the top level."""
    report = {
        "device_name": provenance.device_name(device),
        "device_row": "paper_layer",
        "tau_ms": None,
        "loop_gib_per_s": None,
        "large_gib_per_s": None,
        "expert_bytes": None,
        "gates": gate_reports,
        "memory": memory,
        "bandwidth": smoke_bandwidth,
        "paper_layer": paper_bandwidth,
        "errors": errors,
        "seconds": time.perf_counter() - started,
    }
    if paper_bandwidth is not None:
        for key in ("tau_ms", "loop_gib_per_s", "large_gib_per_s", "expert_bytes"):
            report[key] = paper_bandwidth[key]
    return report


class _Vocabulary:
    """What `checkpoint.embedded_config` reads of a tokenizer: its size and special ids."""

    def __init__(self, size: int):
        self.size, self.bos_token_id, self.eos_token_id, self.pad_token_id = size, 0, 1, None

    def __len__(self) -> int:
        return self.size


def smoke_model(arch: dict, vocab: int, seed: int):
    """The embedded model (an OLMoE) at `arch`'s sizes from a seeded random init, on the
    CPU, float32, its experts and output head scaled by SCALE."""
    from transformers import AutoModelForCausalLM

    from moecache.model import checkpoint, registry

    config = checkpoint.embedded_config(arch, _Vocabulary(vocab), router_aux_loss_coef=0.01)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    adapter = registry.of(model)
    with torch.no_grad():
        for layer in adapter.sizes(model.config).moe_layers:
            experts = adapter.layer_experts(model, layer)
            experts.gate_up_proj.mul_(SCALE["gate_up_proj"])
            experts.down_proj.mul_(SCALE["down_proj"])
        model.lm_head.weight.mul_(SCALE["lm_head"])
    return model


def family_model(family: str, arch: dict, vocab: int, seed: int, folder: Path) -> Path:
    """`family`'s tiny model at the smoke sizes (its experts drawn large enough to matter,
    tiny.model), its output head sharpened as the smoke model's, saved."""
    from moecache.model import tiny

    model = tiny.model(family, arch, vocab, seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(SCALE["lm_head"])
    model.save_pretrained(folder)
    return folder


def smoke_sequences(vocab: int, count: int, tokens: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, tokens), generator=generator).tolist()


@contextlib.contextmanager
def threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gates_report(model, ids, harness: dict, seed: int) -> dict:
    torch.manual_seed(seed)
    report = gates.run(model, ids, harness, seed)
    report["passed"] = not report["failures"]
    return report


def pooled_memory(model, layers, capacity: int, device: str, ring_mib: int) -> dict:
    """What the device holds while `layers` are pooled at `capacity` slots: the weights
    left on it plus the slots (and the link's ring), and whether the pooled layers' own
    expert weights left it; on a GPU beside torch.cuda.memory_allocated."""
    device = torch.device(device)
    cuda = device.type == "cuda"

    def allocated() -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)

    def nbytes(params) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    report = {"restricted_layers": list(layers), "capacity": capacity}
    if cuda:
        report["allocated_unpooled_bytes"] = allocated()
    with decode.offloaded(model, layers, capacity, str(device), ring_mib) as off:
        modules = [off.adapter.experts(mlp) for mlp in off.own.values()]
        offloaded = [p for experts in modules for p in experts.parameters()]
        ids = {id(p) for p in offloaded}
        kept = [p for p in model.parameters() if id(p) not in ids]
        report.update(
            {
                "offloaded_expert_bytes": nbytes(offloaded),
                "offloaded_experts_on_host": all(p.device.type == "cpu" for p in offloaded),
                "other_weights_on_device": all(same_device(p.device, device) for p in kept),
                "weights_bytes": nbytes(kept),
                "slot_bytes": sum(host.slot_bytes for host in off.hosts.values()),
                "link_ring_bytes": off.link.nbytes,
                "harness_device_bytes": off.device_bytes(),  # the harness's own account
            }
        )
        report["held_bytes"] = report["weights_bytes"] + report["slot_bytes"]
        # `moecache plan`'s prediction, from the model's config alone.
        element = next(iter(model.parameters())).element_size()
        planned = plan.held(model.config, layers, capacity, element)["held_bytes"]
        report["planned_held_bytes"] = planned
        report["plan_matches"] = planned == report["held_bytes"]
        if cuda:
            report["allocated_pooled_bytes"] = allocated()
            # Model unpooled, less the experts that left, plus slots and the link's ring.
            expected = (
                report["allocated_unpooled_bytes"]
                - report["offloaded_expert_bytes"]
                + report["slot_bytes"]
                + report["link_ring_bytes"]
            )
            report["allocated_pooled_expected_bytes"] = expected
            report["allocated_pooled_excess_bytes"] = report["allocated_pooled_bytes"] - expected
    if cuda:
        report["allocated_after_bytes"] = allocated()
        report["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return report


def same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:N` alike when N is the current device."""

    def index(d):
        return torch.cuda.current_device() if d.type == "cuda" and d.index is None else d.index

    return a.type == b.type and index(a) == index(b)


def paper_experts(layer: dict, seed: int):
    """The embedded family's experts module at `layer`'s sizes, on the host, seeded random
    weights (N(0, 0.02)) in `layer['dtype']`: what HostExperts and the slot kernel read."""
    from moecache.model import checkpoint, tiny

    return tiny.experts(
        "olmoe", layer, checkpoint.DTYPES[layer["dtype"]], seed, EXPERTS_IMPLEMENTATION
    )


def paper_layer_part(layer: dict, device: str, multipliers, ring_mib: int, rounds: int, seed):
    experts = paper_experts(layer, seed)
    result = bandwidth.measure([experts], device, multipliers, ring_mib, rounds)
    result["layer"] = {
        **layer,
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
        else:
            lines.extend(f"gates {dtype}: {failure}" for failure in r["failures"])
            lines.append(f"gates {dtype}: {'passed' if r['passed'] else 'FAILED'}")
    if report["tau_ms"] is not None:
        lines.append(
            f"device row (paper layer): tau {report['tau_ms']:.4f} ms, loop "
            f"{report['loop_gib_per_s']:.2f} GiB/s, one large copy "
            f"{report['large_gib_per_s']:.2f} GiB/s"
        )
    return lines
