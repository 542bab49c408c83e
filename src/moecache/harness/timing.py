"""Real timers: CUDA events on a GPU, the monotonic clock on a CPU."""

from __future__ import annotations

import time

import torch


class Stopwatch:
    """Times a span of work on `device`; `stop()` returns seconds and waits for the device."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> Stopwatch:
        if self.cuda:
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3
        return time.perf_counter() - self._t0
