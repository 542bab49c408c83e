"""gpu-check's paper-shaped models: OLMoE-1B-7B's layers and a GPT-OSS-20B with MXFP4
experts, random weights, written as safetensors checkpoints and loaded through the real
path (`jobs.load_model`: host read, one pinned copy of the restricted layers' experts, the
rest on the device, counted by the accountant).

Per model, the real gates and decode jobs on a few short sequences, each job's peaks
measured three ways: the accountant's (model/memory.py LEDGER), the CUDA allocator's
(torch.cuda.max_memory_allocated; none on a CPU) and the plan's (`accountant.account`, from the
checkpoint's config alone). The allocator also holds activations, the KV cache and the
CUDA context's workspace, which the accountant does not count: that difference is
reported, not judged. The accountant more than PLAN_SHARE off the plan fails the check.

On the OLMoE, the decode job times LRU blocking against LRU overlapped (a copy stream,
harness/copy_engine.py, with and without the `pregate` prefetcher) at 1x and at
SLOW_MULTIPLIER: ms per token with its bootstrap interval, and whether overlap helped.

Every function takes its device: the tests run them on the CPU at reduced sizes.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import tempfile
from pathlib import Path

import torch

from moecache import config as configs
from moecache.config import run_spec
from moecache.harness import gates, jobs, runs
from moecache.harness.check_models import paper_checkpoint, smoke_sequences
from moecache.model import checkpoint, registry
from moecache.model.memory import LEDGER
from moecache.runs import RunName
from moecache.schedule import accountant

CONFIGS = Path(__file__).resolve().parents[3] / "config"
PLAN_SHARE = 0.05  # the accountant's peaks against the plan's, as tests/test_memory.py
SLOW_MULTIPLIER = 10
BLOCKING = "lru"
OVERLAPPED = ("lru-overlap", "lru-overlap-pregate")
# LRU blocking, and overlapped without and with the next layer's router prefetching, each
# at 1x and at the slower link: the 1x runs interleaved token by token in one pass, each
# scaled run in lockstep beside its own 1x twin (runs.decode_runs).
TIMED_RUNS = {
    BLOCKING: run_spec("lru"),
    OVERLAPPED[0]: run_spec("lru", overlap=True),
    OVERLAPPED[1]: run_spec("lru", overlap=True, prefetch="pregate"),
}


@dataclasses.dataclass(frozen=True)
class PaperModel:
    """One paper-shaped model: config/<config>'s checkpoint (its published config.json in
    config/checkpoints/), dtype and harness, cut to `layers` layers."""

    config: str
    layers: int
    restricted: tuple
    vocab: int | None = None  # None: the checkpoint's own
    stored: str | None = None  # the experts' stored format (tiny_quantized.WRITERS)
    timed: bool = False  # decode LRU blocking against overlapped
    shrink: dict = dataclasses.field(default_factory=dict)  # config keys changed (tests)


PAPER_MODELS = {
    # OLMoE-1B-7B cut from 16 layers to 4 (two offloaded), its real vocabulary: 3.8 GB of
    # bfloat16 weights, 12.6 MB an expert.
    "olmoe": PaperModel("olmoe.yaml", 4, (1, 2), timed=True),
    # GPT-OSS-20B cut from 24 layers to 2 (the second offloaded, kept as MXFP4, 13 MB an
    # expert; the first dequantized to bfloat16 by transformers), its vocabulary cut from
    # 201,088 to 32,768 (the embeddings are not what is measured).
    "gpt_oss": PaperModel("gpt-oss-20b.yaml", 2, (1,), vocab=32768, stored="mxfp4"),
}


def checkpoint_config(model: PaperModel):
    """The checkpoint's published config, its layers cut to `model.layers`, no special
    token ids (random ids may be any), untied embeddings, `model.shrink` applied."""
    settings = configs.load(CONFIGS / model.config)
    config = copy.deepcopy(accountant.checkpoint_config(settings))
    config.num_hidden_layers = model.layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: model.layers]
    if model.vocab:
        config.vocab_size = model.vocab
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, key, None)
    config.tie_word_embeddings = False
    for key, value in model.shrink.items():
        setattr(config, key, value)
    return config


def paper_settings(model: PaperModel, config, folder, device: str, pace: dict) -> dict:
    """config/<model.config>'s settings for the checkpoint in `folder`: its architecture as
    written, the restricted layers, C = N/2 (the paper's 32 of 64), decoding on `device`;
    `pace`: tokens, warmup_tokens, repeats. The timed model decodes TIMED_RUNS at 1x and
    SLOW_MULTIPLIER, the other LRU at 1x."""
    settings = configs.load(CONFIGS / model.config)
    sizes = registry.adapter_for(config.model_type).sizes(config)
    arch = settings["model"]["architecture"]
    arch.update({key: getattr(sizes, key) for key in checkpoint.ARCH_KEYS})
    settings["model"]["source"] = str(folder)
    harness = settings["harness"]
    harness.update(
        device=device,
        restricted_layers=list(model.restricted),
        capacity=sizes.num_experts // 2,
        warmup_tokens=pace["warmup_tokens"],
        gate_repeats=1,
        repeats=pace["repeats"],
    )
    harness.pop("device_gib", None)  # the all-resident reference kept: the gates' C = N
    multipliers = [1, SLOW_MULTIPLIER] if model.timed else [1]
    timed = TIMED_RUNS if model.timed else {BLOCKING: TIMED_RUNS[BLOCKING]}
    harness["runs"] = {name: {**spec, "multipliers": multipliers} for name, spec in timed.items()}
    settings["corpus"]["heldout"]["max_tokens"] = pace["tokens"]
    return settings


@dataclasses.dataclass
class Loaded:
    """A paper-shaped model loaded as a job loads it, with what its jobs read."""

    settings: dict
    planned: dict  # accountant.account's figures for the checkpoint
    model: object
    ids: list
    seed: int

    @property
    def device(self) -> str:
        return self.settings["harness"]["device"]


def load(model: PaperModel, folder: Path, device: str, pace: dict, seed: int) -> Loaded:
    """`model` written to `folder` (drawn and quantized on `device`), planned, and loaded
    onto `device` by jobs.load_model (which resets the accountant)."""
    config = checkpoint_config(model)
    dtype = configs.load(CONFIGS / model.config)["model"]["dtype"]
    paper_checkpoint(config, checkpoint.DTYPES[dtype], folder, seed, model.stored, device)
    release(device)  # what drawing and quantizing left in the allocator's cache
    settings = paper_settings(model, config, folder, device, pace)
    ids = smoke_sequences(config.vocab_size, pace["sequences"], pace["tokens"], seed)
    planned = accountant.account(settings, source=str(folder), tokens=pace["tokens"])
    return Loaded(settings, planned, jobs.load_model(settings, str(folder), device), ids, seed)


def gates_job(job: Loaded) -> dict:
    """The real gates; their peaks, and their verdicts recorded, not judged: a random
    bfloat16 model's teacher-forced and batched NLLs are two roundings (the smoke model's
    gates hold a device to that, docs/gpu-check.md)."""
    reset_peaks(job.device)
    torch.manual_seed(job.seed)
    gated = gates.run(job.model, job.ids, job.settings["harness"], job.seed)
    gc.collect()
    return {
        "memory": job_memory("gates", job.planned, job.device),
        "verdicts": {"failures": gated["failures"], "batched_nll": gated["batched_nll"]},
    }


def decode_job(job: Loaded) -> tuple[dict, runs.Decoded]:
    """The real decode job over the first shard's runs; its peaks, and what it decoded."""
    reset_peaks(job.device)
    shard = next(iter(job.settings["corpus"]["heldout"]["shards"]))
    planned_runs = runs.runs_for_shard(job.settings, shard, shard)
    decoded = runs.decode_runs(job.settings, job.model, job.ids, planned_runs)
    return job_memory("decode", job.planned, job.device), decoded


def run_directly(label: str, work):
    return work()


def measure(
    name: str, model: PaperModel, device: str, pace: dict, seed: int, log, step=run_directly
) -> dict:
    """`model` written, loaded onto `device` by jobs.load_model, through the gates and the
    decode job: each job's peaks (job_memory), the gates' verdicts, and on the timed model
    blocking against overlapped copies (overlap_timing). `step(label, work)` runs each
    stage (gpu_check's records a stage that raises and goes on; a None result is a stage
    that did not finish, and what follows it is left out)."""
    report: dict = {"memory": {}}
    with tempfile.TemporaryDirectory(prefix=f"moecache-paper-{name}-") as tmp:
        job = step(f"paper {name} load", lambda: load(model, Path(tmp) / name, device, pace, seed))
        if job is None:
            return report
        report["settings"] = {"model": job.settings["model"], "harness": job.settings["harness"]}
        report["expert_bytes"] = job.planned["expert_bytes"]
        gated = step(f"paper {name} gates", lambda: gates_job(job))
        if gated is not None:
            report["memory"]["gates"], report["gates"] = gated["memory"], gated["verdicts"]
        decoded = step(f"paper {name} decode", lambda: decode_job(job))
        job = None  # the model freed before the next part
        release(device)
    if decoded is not None:
        report["memory"]["decode"], decoded = decoded
        if model.timed:
            report["overlap"] = overlap_timing(decoded)
    for stage, held in report["memory"].items():
        log(memory_line(f"{name} {stage}", held))
    for line in overlap_lines(report.get("overlap", {})):
        log(f"  {name} {line}")
    return report


def release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def reset_peaks(device: str) -> None:
    """Each job's peaks from here on, on both counters."""
    gc.collect()
    LEDGER.reset_peak()
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def job_memory(job: str, planned: dict, device: str) -> dict:
    """The job's peaks by the accountant, the allocator and the plan, and their ratios."""
    ledger = LEDGER.report()
    device_plan = planned["job_device_peak_bytes"][job]
    held = {
        "ledger_device_peak_bytes": ledger["device_peak_bytes"],
        "ledger_host_peak_bytes": ledger["host_peak_bytes"],
        "plan_device_peak_bytes": device_plan,
        "plan_host_peak_bytes": planned["host_peak_bytes"],
        "ledger_to_plan_device": ledger["device_peak_bytes"] / device_plan,
        "ledger_to_plan_host": ledger["host_peak_bytes"] / planned["host_peak_bytes"],
        "device_peak_parts": ledger["device_peak_parts"],
        "allocator_peak_bytes": None,
    }
    if torch.device(device).type == "cuda":
        allocated = torch.cuda.max_memory_allocated(device)
        held["allocator_peak_bytes"] = allocated
        # Activations, the KV cache, the CUDA context's workspace: not the accountant's.
        held["allocator_minus_ledger_bytes"] = allocated - ledger["device_peak_bytes"]
        held["allocator_to_ledger"] = allocated / ledger["device_peak_bytes"]
    return held


def memory_failures(label: str, memory: dict) -> list[str]:
    """Each job whose accountant's device or host peak is more than PLAN_SHARE off the
    plan's, in one phrase."""
    found = []
    for job, held in memory.items():
        for where in ("device", "host"):
            ratio = held[f"ledger_to_plan_{where}"]
            if abs(ratio - 1) > PLAN_SHARE:
                found.append(
                    f"{label} {job}: the accountant's {where} peak "
                    f"{held[f'ledger_{where}_peak_bytes'] / 2**30:.3f} GiB is "
                    f"{100 * (ratio - 1):+.1f}% off the plan's "
                    f"{held[f'plan_{where}_peak_bytes'] / 2**30:.3f} GiB"
                )
    return found


def overlap_timing(decoded: runs.Decoded) -> dict:
    """Per multiplier: ms per token (its 95% bootstrap interval) of LRU blocking and of
    each overlapped run, and whether overlap helped (`faster`: its interval wholly below
    blocking's; `slower`: wholly above; else `within noise`). At 1x the three are
    interleaved in one pass; at the slower link each decoded beside its own 1x twin, one
    group after another, so its twin's ms per token is given to compare drift by."""
    results, by_multiplier = decoded.results, {}
    for m in (1, SLOW_MULTIPLIER):
        rows = {}
        for name in (BLOCKING, *OVERLAPPED):
            totals = results[str(RunName(name, m))]["totals"]
            rows[name] = {
                "ms_per_token": totals["step_ms"],
                "ms_per_token_ci": list(totals["step_ms_ci"]),
                "copies_per_token": totals["copies_per_token"],
                **{k: totals[k] for k in ("stall_ms", "hidden_copy_ms") if k in totals},
            }
            if m > 1:
                rows[name]["twin_ms_per_token"] = decoded.twins[name]["totals"]["step_ms"]
        for name in OVERLAPPED:
            rows[name]["overlap_helped"] = verdict(rows[name], rows[BLOCKING])
            rows[name]["to_blocking"] = rows[name]["ms_per_token"] / rows[BLOCKING]["ms_per_token"]
        by_multiplier[str(m)] = rows
    return by_multiplier


def verdict(overlapped: dict, blocking: dict) -> str:
    low, high = overlapped["ms_per_token_ci"]
    if high < blocking["ms_per_token_ci"][0]:
        return "faster"
    if low > blocking["ms_per_token_ci"][1]:
        return "slower"
    return "within noise"


def memory_line(label: str, held: dict) -> str:
    line = (
        f"  {label}: accountant {held['ledger_device_peak_bytes'] / 2**30:.3f} GiB device "
        f"({held['ledger_to_plan_device']:.3f} of the plan's), "
        f"{held['ledger_host_peak_bytes'] / 2**30:.3f} GiB host "
        f"({held['ledger_to_plan_host']:.3f})"
    )
    if held["allocator_peak_bytes"] is not None:
        line += (
            f"; allocator {held['allocator_peak_bytes'] / 2**30:.3f} GiB "
            f"(+{held['allocator_minus_ledger_bytes'] / 2**20:.0f} MiB over the accountant)"
        )
    return line


def overlap_lines(timing: dict) -> list[str]:
    lines = []
    for m, rows in timing.items():
        cells = ", ".join(
            f"{name} {row['ms_per_token']:.2f} ms"
            + (f" ({row['overlap_helped']})" if "overlap_helped" in row else "")
            for name, row in rows.items()
        )
        lines.append(f"x{m} ms/token: {cells}")
    return lines
