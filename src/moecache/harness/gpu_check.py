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
check_parts.measure_device and `finish` do the work on any device (the tests call them on
the CPU at reduced sizes). The parts are check_parts.py's, their sizes check_sizes.py's.
"""

from __future__ import annotations

import warnings

import torch

from moecache import provenance
from moecache.errors import MoecacheError
from moecache.harness import check_parts, paper_check
from moecache.harness.check_parts import say

NO_CUDA = "no CUDA device: make gpu-check needs one (torch.cuda.is_available() is False)"


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
    report, settings = check_parts.measure_device(str(dev), log=log, **sizes)
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
