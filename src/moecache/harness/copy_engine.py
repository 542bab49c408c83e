"""Asynchronous expert copies: a copy engine beside the compute, one ticket per expert.

The blocking pool (pool.py) copies on the compute's own path; here the copies run beside it
and the compute waits on an expert's ticket only right before it uses that expert. The
time the compute spent waiting is the stall; the copy time not waited for is hidden.

- CPU (`HostCopyEngine`): one worker thread takes copies from a queue, in order, on a core
  of its own (torch releases the GIL in `copy_`). A copy multiplier m is the worker really
  taking m times as long: it sleeps until m times this machine's copy time has passed since
  the copy began, so its core idles and the compute core is untouched. This machine's copy
  time is measured once per process (`calibrate`, shared by every engine), before any
  decoding, as the blocking pool times its copies: a copy timed on the worker during
  decoding also holds its wait for the GIL and the compute's pressure on the memory system,
  which m would multiply, and differently for each run. The interpreter's switch interval is
  cut so that the waiting worker gets the GIL within tens of microseconds, not the default
  5 ms. Timed on the monotonic clock.
- CUDA (`DeviceCopyEngine`): a copy stream beside the compute stream, from pinned host
  memory; one event pair per expert; the compute stream waits on an expert's end event only
  when about to use it, and that wait is timed with events on the compute stream. The
  multiplier is the slower link's ring (link.py), queued on the copy stream.

Both engines copy in submission order, so a slot reused by a later copy is written after the
earlier copy into it has landed.
"""

from __future__ import annotations

import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch

from moecache import gpu
from moecache.errors import MoecacheError
from moecache.harness.link import SlowLink
from moecache.harness.timing import Lap


class HostTicket:
    """One expert's copy on the worker: `start` and `end` on time.perf_counter()."""

    def __init__(self, expert: int):
        self.expert, self.start, self.end, self.error = expert, None, None, None
        self.landed = threading.Event()

    def seconds(self) -> float:
        """The worker's time on this copy, its hold included (read once it has landed)."""
        return self.end - self.start


# Seconds a thread waiting for the GIL lets the holder run before asking it to drop the GIL
# (Python's default 5 ms would hold a finished copy back for most of a CPU step).
SWITCH_INTERVAL_S = 5e-5
CALIBRATION_GROUPS = 9
COPY_SECONDS: dict[int, float] = {}  # expert bytes -> this machine's seconds per copy


class HostCopyEngine:
    def __init__(self, multiplier: int):
        if multiplier < 1:
            raise MoecacheError(f"copy multiplier {multiplier} must be >= 1")
        # The compute keeps one core and the copy worker takes another: with torch's own
        # thread pool on every core, the worker's copies would slow the compute they overlap.
        torch.set_num_threads(1)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.multiplier = multiplier
        self.reference: float | None = None  # this machine's copy time (calibrate)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        worker = threading.Thread(target=self.serve, name="moecache-copy", daemon=True)
        worker.start()

    def calibrate(self, expert_bytes: int, group: Callable[[int], float]) -> None:
        """This machine's seconds per copy of an expert of `expert_bytes`, measured once per
        process: the median over CALIBRATION_GROUPS calls of `group(i)` (the i-th group of
        other experts, copied as the blocking pool copies a group) on the calling thread,
        the worker idle. Every engine of the process then prices its link alike."""
        if expert_bytes not in COPY_SECONDS:
            laps = [group(i) for i in range(CALIBRATION_GROUPS)]
            COPY_SECONDS[expert_bytes] = statistics.median(laps)
        self.reference = COPY_SECONDS[expert_bytes]

    def submit(self, expert: int, copy: Callable[[], None]) -> HostTicket:
        if self.multiplier > 1 and self.reference is None:
            raise MoecacheError(
                f"copy engine at {self.multiplier}x: no copy time to slow (calibrate first)"
            )
        ticket = HostTicket(expert)
        self.jobs.put((copy, ticket))
        return ticket

    def serve(self) -> None:
        while True:
            copy, ticket = self.jobs.get()
            ticket.start = time.perf_counter()
            try:
                copy()
            except Exception as error:  # handed to whoever waits on the ticket
                ticket.error = error
            self.hold(ticket.start, self.reference)
            ticket.end = time.perf_counter()
            ticket.landed.set()
            # The worker lives as long as the process: what the last copy reached (its
            # pool and slots) must not live on with it.
            copy = ticket = None

    def hold(self, started: float, copy_seconds: float | None) -> None:
        """A link m times slower: sleep (no spinning: a spinning thread would hold the GIL
        and load the compute) until m times this machine's copy time has passed since the
        copy began (at 1x, nothing: the copy itself; submit refused m > 1 without it)."""
        if self.multiplier == 1:
            return
        rest = started + self.multiplier * copy_seconds - time.perf_counter()
        if rest > 0:
            time.sleep(rest)

    def wait(self, ticket: HostTicket) -> Lap:
        """Block until `ticket` has landed; the lap is the time the compute stalled."""
        stalled = 0.0
        if not ticket.landed.is_set():
            began = time.perf_counter()
            ticket.landed.wait()
            stalled = time.perf_counter() - began
        if ticket.error is not None:
            raise MoecacheError(f"copy of expert {ticket.expert}: {ticket.error}")
        return Lap(seconds_=stalled)


class DeviceTicket:
    """One expert's copy on the copy stream, between two timing events."""

    def __init__(self, expert: int, device):
        self.expert = expert
        self.start, self.end = gpu.event(device), gpu.event(device)

    def seconds(self) -> float:
        return Lap(self.start, self.end).seconds()


class DeviceCopyEngine:
    def __init__(self, device: torch.device, multiplier: int, link: SlowLink):
        self.device, self.multiplier, self.link = device, multiplier, link
        self.stream = gpu.new_stream(device)

    def submit(self, expert: int, copy: Callable[[], None]) -> DeviceTicket:
        compute = gpu.current_stream(self.device)
        # The slot may still be read by compute queued before this copy: wait for it.
        queued = gpu.event(self.device, timing=False)
        queued.record(compute)
        ticket = DeviceTicket(expert, self.device)
        with gpu.on_stream(self.stream):
            self.stream.wait_event(queued)
            ticket.start.record(self.stream)
            copy()
            self.link.repeat(self.multiplier - 1)  # the slower link's ring, on this stream
            ticket.end.record(self.stream)
        return ticket

    def calibrate(self, expert_bytes: int, group) -> None:
        """The ring makes the slower link on a GPU: nothing to measure."""

    def wait(self, ticket: DeviceTicket) -> Lap:
        """The compute stream waits for the copy; the lap times that wait (read later)."""
        compute = gpu.current_stream(self.device)
        before, after = gpu.event(self.device), gpu.event(self.device)
        before.record(compute)
        compute.wait_event(ticket.end)
        after.record(compute)
        return Lap(before, after)


def make(device, multiplier: int, link: SlowLink):
    """The copy engine for `device`: a copy stream on CUDA, a copy worker on a CPU."""
    device = torch.device(device)
    if gpu.cuda_path(device):
        return DeviceCopyEngine(device, multiplier, link)
    return HostCopyEngine(multiplier)
