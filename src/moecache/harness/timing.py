"""Real timers: CUDA events on a GPU (stand-ins in a rehearsal: gpu.py), the monotonic clock
on a CPU."""

from __future__ import annotations

import time

import torch

from moecache import gpu


class Stopwatch:
    """Times a span of work on `device`; `stop()` returns seconds and waits for the device."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = gpu.cuda_path(self.device)

    def start(self) -> Stopwatch:
        if self.cuda:
            self._start = gpu.event(self.device)
            self._start.record(gpu.current_stream(self.device))
        else:
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> float:
        return self.lap().seconds()

    def lap(self) -> Lap:
        """End the span without waiting: read `seconds()` once the device has passed it
        (the harness reads its copy timers after the token's own timer has waited)."""
        if self.cuda:
            end = gpu.event(self.device)
            end.record(gpu.current_stream(self.device))
            return Lap(start=self._start, end=end)
        return Lap(seconds_=time.perf_counter() - self._t0)


class Lap:
    def __init__(self, start=None, end=None, seconds_: float | None = None):
        self.start, self.end, self.seconds_ = start, end, seconds_

    def seconds(self) -> float:
        if self.seconds_ is None:
            self.end.synchronize()
            self.seconds_ = self.start.elapsed_time(self.end) / 1e3
        return self.seconds_
