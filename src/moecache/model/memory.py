"""The accountant: every byte a job places on the device or keeps in host memory for the
offloaded experts, by what it is, and the peak of each, on a CPU as on CUDA.

The model's resident weights, the host experts, the device slots, the staging of one
layer's own experts and the slower link's rings are allocated (or, for weights that
transformers placed, adopted) through one `Ledger`; a tensor's bytes leave the ledger when
the tensor is collected, so the ledger follows what is alive as the CUDA allocator does
(`torch.cuda.max_memory_allocated`), whatever the device. `moecache plan` predicts the same
figures from the config alone with `job_peaks`, the one formula both sides share.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from unittest import mock

import torch

from moecache import gpu
from moecache.errors import MoecacheError

DEVICE, HOST = "device", "host"
LOAD = "load"  # the phase of a job that reads its checkpoint and places its weights


class Ledger:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Nothing held and the peaks at zero (a job's start; tests between models)."""
        self.held = {DEVICE: {}, HOST: {}}  # where -> what -> bytes alive
        self.peak = {DEVICE: 0, HOST: 0}
        self.peak_parts = {DEVICE: {}, HOST: {}}  # what made up each peak
        self.phase, self.phases = None, {}  # phase -> where -> its peak

    def reset_peak(self) -> None:
        """The peaks from now on (what is held stays counted), as
        torch.cuda.reset_peak_memory_stats: each job of one process measured apart."""
        for where, held in self.held.items():
            self.peak[where], self.peak_parts[where] = sum(held.values()), dict(held)

    def begin(self, phase: str) -> None:
        """A phase of the job from now on (gates, decode): the peaks reset, and each
        phase's own kept apart (`phases`) from what it starts with."""
        self.reset_peak()
        self.phase = phase
        self.phases[phase] = dict(self.peak)

    def record(self, phase: str, where: str, nbytes: int) -> None:
        """A peak measured apart (the load phase's host census), kept as the phase's."""
        peaks = self.phases.setdefault(phase, {DEVICE: 0, HOST: 0})
        peaks[where] = max(peaks.get(where, 0), nbytes)

    def empty(self, what: str, where: str, shape, dtype, device, pin=False) -> torch.Tensor:
        """A new tensor, counted under `what` in `where` until it is collected."""
        tensor = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
        return self.adopt(what, where, tensor)

    def adopt(self, what: str, where: str, tensor: torch.Tensor) -> torch.Tensor:
        """Count a tensor allocated elsewhere (a weight transformers placed, a pinned copy)."""
        nbytes = tensor.numel() * tensor.element_size()
        self._add(what, where, nbytes)
        weakref.finalize(tensor, self._add, what, where, -nbytes)
        return tensor

    def _add(self, what: str, where: str, nbytes: int) -> None:
        held = self.held[where]
        held[what] = held.get(what, 0) + nbytes
        if held[what] == 0:
            del held[what]
        total = sum(held.values())
        if total > self.peak[where]:
            self.peak[where] = total
            self.peak_parts[where] = dict(held)
        if self.phase is not None:
            self.record(self.phase, where, total)

    def bytes(self, where: str) -> int:
        return sum(self.held[where].values())

    def report(self) -> dict:
        return {
            "device_peak_bytes": self.peak[DEVICE],
            "host_peak_bytes": self.peak[HOST],
            "device_peak_parts": self.peak_parts[DEVICE],
            "host_peak_parts": self.peak_parts[HOST],
            "phase_peak_bytes": {phase: dict(peaks) for phase, peaks in self.phases.items()},
        }


# One per process, as torch.cuda's memory statistics are: every allocation of a job goes
# through it, wherever in the harness it is made.
LEDGER = Ledger()


SYNC_LOAD = "HF_DEACTIVATE_ASYNC_LOAD"  # transformers reads on the calling thread alone


@contextlib.contextmanager
def host_census():
    """Every host (CPU) allocation made inside, counted by torch's profiler as the
    allocator reports it: `box["peak"]` the most alive at once, `box["end"]` what is still
    alive at the end (bytes, from zero at the start). What a job allocates while it reads
    a checkpoint (the mapped safetensors files, the experts read into place, any
    transformers fuses and the stacks it fuses them from), which no Ledger call sees."""
    from torch.profiler import ProfilerActivity, profile

    box = {"peak": 0, "end": 0}
    # The profiler records the thread that runs it: transformers' loader threads (the
    # tensors it casts as it reads them) are kept off while the census counts.
    with (
        mock.patch.dict(os.environ, {SYNC_LOAD: "1"}),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        yield box
    box["peak"], box["end"] = running_peak(prof.events())


def running_peak(events) -> tuple[int, int]:
    """The most host bytes alive at once and at the end, over profiler events in the order
    they began: an op's own allocations net of its own frees at its start, a free outside
    any op where it happens."""
    alive = peak = 0
    for event in sorted(events, key=lambda e: e.time_range.start):
        is_free = event.name == "[memory]"
        alive += event.cpu_memory_usage if is_free else event.self_cpu_memory_usage
        peak = max(peak, alive)
    return peak, alive


def count_cache(cache) -> None:
    """A transformers KV cache's tensors counted on the device while they live (a cache
    grows token by token: counted once it holds its sequence, where a job's peak is)."""
    for layer in getattr(cache, "layers", None) or []:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                LEDGER.adopt("kv cache", DEVICE, tensor)


def nll_check_bytes(tokens: int, vocab: int, element: int) -> int:
    """What the whole-sequence NLL check (harness/nll.py batched_nll_sums) holds beside
    its KV cache: the logits [T, V] in the model's dtype, their float32 copy (none where the
    logits are float32) and float32 log-probabilities, over the T - 1 scored positions."""
    scored = (tokens - 1) * vocab * 4
    return tokens * vocab * element + scored * (2 if element != 4 else 1)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# The slower link (harness/link.py SlowLink): its kinds and its rings' sizes, by which the
# link allocates them and `moecache plan` counts them.
LINK_KINDS = ("auto", "ring", "charge", "hold")
HOST_CLOCK = ("charge", "hold")  # kinds that time copies on the host clock: CPU only


def ring_mib(harness: dict) -> int:
    """The host ring's size in MiB (`harness.link_ring_mib`)."""
    return harness["link_ring_mib"]


def slow_link_kind(kind: str, device) -> str:
    """`auto` as the device's kind: `ring` on CUDA, `charge` on a CPU."""
    device = torch.device(device)
    if kind not in LINK_KINDS:
        raise MoecacheError(f"harness.slow_link: {kind!r} is not one of {', '.join(LINK_KINDS)}")
    if kind == "auto":
        return "ring" if gpu.cuda_path(device) else "charge"
    if kind in HOST_CLOCK and gpu.cuda_path(device):
        raise MoecacheError(
            f"harness.slow_link: {kind} times each copy on the host clock, but CUDA copies "
            "are queued asynchronously: use ring (or auto) on a GPU"
        )
    return kind


def ring_blocks(ring_mib: int, expert_bytes: int, device_blocks: int) -> tuple[int, int]:
    """The rings' sizes in experts, (host, device): the host ring at least `ring_mib` MiB,
    the device ring one block a slot; two each at least. `moecache plan` sizes them by it."""
    return max(2, -(-ring_mib * 2**20 // expert_bytes)), max(2, device_blocks)


def device_peak(weights: int, expert: int, slots: int, staged: int, ring: int, kv: int) -> int:
    """What a job holds on the device at one moment: the resident weights, `slots` expert
    slots in all, `staged` experts of an own block staged, the link's device ring and the
    KV cache (bytes; `expert`: one expert's). The plan and the accountant's test both size a
    job's phases with it."""
    return weights + (slots + staged) * expert + ring + kv


def device_total_bytes(device) -> int:
    """What the device has: a GPU's memory; on a CPU, where the device and the host share
    the memory, the machine's physical memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
