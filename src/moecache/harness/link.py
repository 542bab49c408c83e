"""The copy multiplier as a slower link: m copies of an expert cost m times one copy.

Three ways (`harness.slow_link`, default `auto`: `ring` on CUDA, `charge` on a CPU):

- `ring` (CUDA): every expert copy moves m times its bytes over the same path, host to
  device. The first copy is the real one, into the expert's slot; each of the other m - 1
  copies an expert-shaped block of a host ring into a block of a device ring, with the
  same calls, shapes and bytes. Every repeat takes the next blocks; the host ring is
  larger than a last-level cache, so each repeat reads memory no cache holds, as a real
  copy reads an offloaded expert; the device ring has as many blocks as the run's slots.
  The rings are written once, when a run first repeats a copy, so their pages are real memory.
- `charge` (CPU): a group of real copies (one token's misses at one layer) is timed on the
  monotonic clock, and m - 1 times the group's own time is added to the group's copy time
  and to the token's step time: the clocks are charged what a link m times slower would
  have taken, and nothing waits it out.
- `hold` (CPU): the same group, timed the same way, and then the link is held, spinning on
  the clock without touching memory, until m times the group's time has passed.

Why a CPU is charged rather than made to wait or copy more: the "device" is the host, so
whatever stands in for a slower link changes the compute around it, a cost no GPU link
has. Ring repeats push m times the expert bytes through the shared last-level cache and
evict the weights the next token computes with; a held link leaves the core idle for
milliseconds inside each token, and the compute after it runs slower (spinning or
sleeping alike). Both made the scaled runs' compute per token grow with m, so equation (1)
missed them. `moecache link-check` measures this on the machine at hand: LRU decoded at 1x
and at the largest multiplier under each CPU kind, interleaved (README, `link` block).
Either way the group is priced after it, not copy by copy, so that the copies run back to
back after the token's compute at every m, as at 1x: a copy after an idle wait costs more
than one right after another, and holding after each copy priced 10x as 13.7x.
(Repeating the copy of the same expert into the same slot is no answer either: served
from the caches, tau(10) was 3 x tau(1).)
"""

from __future__ import annotations

import time

import torch

from moecache import gpu
from moecache.config.keys import run_multipliers
from moecache.model.memory import DEVICE, HOST, HOST_CLOCK, LEDGER, ring_blocks, slow_link_kind


def configured(harness: dict) -> str:
    """The link kind a harness config asks for (`harness.slow_link`, default auto)."""
    return harness["slow_link"]


def multipliers(harness: dict) -> list[int]:
    """Every copy multiplier the runs of a harness config use, 1 included, ascending."""
    runs = harness["runs"].values()
    return sorted({1, *(m for spec in runs for m in run_multipliers(spec))})


def spin_until(deadline: float) -> None:
    """Wait on the monotonic clock (time.perf_counter) without touching memory."""
    while time.perf_counter() < deadline:
        pass


class SlowLink:
    def __init__(self, expert, device, ring_mib: int, pin: bool, device_blocks: int, kind="auto"):
        """`expert`: one expert's weight tensors (shapes and dtypes: HostExperts.first_expert);
        for a ring, a host ring of `ring_mib` MiB and a device ring of `device_blocks` experts."""
        self.kind = slow_link_kind(kind, device)
        # nbytes: what the link holds on the device (its device ring), host_bytes: on the host.
        self.non_blocking, self.at, self.nbytes, self.host_bytes = pin, 0, 0, 0
        if self.kind in HOST_CLOCK:
            return
        expert_bytes = sum(w.numel() * w.element_size() for w in expert)
        self.host_blocks, self.device_blocks = ring_blocks(ring_mib, expert_bytes, device_blocks)
        self.expert, self.where, self.pin, self.expert_bytes = expert, device, pin, expert_bytes
        self.host, self.device = [], []  # made when a run first repeats a copy (`rings`)

    def rings(self) -> None:
        """The rings, made and written once, by the first copy a multiplier above 1 repeats
        (in the arms' untimed warm-up), so that a job that runs at 1x alone holds none;
        counted by the accountant."""

        def ring(like, side, count, pinned=False):
            # Each made where it lives (no host copy of the device ring on its way there);
            # in a rehearsal on a CPU the device ring is a host tensor, counted as the device's.
            shape, dtype = (count, *like.shape), like.dtype
            if side == HOST:
                block = (gpu.empty_pinned if pinned else torch.empty)(shape, dtype=dtype)
            else:
                block = torch.empty(shape, dtype=dtype, device=self.where)
            return LEDGER.adopt("link ring", side, block.fill_(1))

        self.host = [ring(w, HOST, self.host_blocks, self.pin) for w in self.expert]
        self.device = [ring(w, DEVICE, self.device_blocks) for w in self.expert]
        self.nbytes = self.device_blocks * self.expert_bytes
        self.host_bytes = self.host_blocks * self.expert_bytes

    def hold(self, times: int, started: float) -> None:
        """After a group of real copies begun at `started` (time.perf_counter()): a held
        link waits `times` times the group's time more; a ring has queued its copies."""
        if self.kind != "hold" or times <= 0:
            return
        spin_until(started + (times + 1) * (time.perf_counter() - started))

    def charge(self, times: int, lap) -> float:
        """After a group of real copies timed by `lap`: the seconds a charged link adds to
        the clocks, `times` times the group's time (0 for the other kinds, whose laps are
        not read here: a CUDA lap is read only once the step has waited)."""
        return times * lap.seconds() if self.kind == "charge" and times > 0 else 0.0

    def repeat(self, times: int) -> None:
        """After one real copy: a ring queues `times` more copies of one expert's bytes,
        each from cold addresses; a held link waits once the group is done (`hold`)."""
        if self.kind != "ring" or times <= 0:
            return
        if not self.device:
            self.rings()
        for _ in range(times):
            self.at += 1
            src, dst = self.at % self.host_blocks, self.at % self.device_blocks
            for host, device in zip(self.host, self.device, strict=True):
                device[dst].copy_(host[src], non_blocking=self.non_blocking)
