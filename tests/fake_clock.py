"""A clock for timing tests: it moves only when a test says so, so that what the harness
adds up can be asserted exactly, whatever else the machine is doing."""

from __future__ import annotations


class FakeClock:
    """Stands in for the `time` module of the harness modules given to `install`: its
    `perf_counter` moves by `tick` per read (so that a loop spinning on it ends) and by
    whatever `advance` or `sleep` adds."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick, self.reads = 0.0, tick, 0

    def perf_counter(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    sleep = advance

    def install(self, monkeypatch, *modules) -> FakeClock:
        for module in modules:
            monkeypatch.setattr(module, "time", self)
        return self
