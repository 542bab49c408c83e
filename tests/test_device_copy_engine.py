"""The CUDA copy engine (harness/copy_engine.py DeviceCopyEngine) on a CPU: torch.cuda's
streams and events replaced by stand-ins that log what is queued where and time on the
host clock, the copies themselves real and synchronous. What this checks: the order of what
the engine queues on each stream (the copy after the compute queued before it, the slower
link's ring after the copy, the ticket's events around both; the compute waiting on the
ticket's end between two timing events), and an overlapped decode through it, in the CUDA
path's rehearsal (gpu.py), keeping the blocking run's NLL and copies. What it cannot: that
CUDA runs the copy stream beside the compute, the events' device times, pinned
non-blocking copies (`make gpu-check` does)."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import pytest
import torch

from moecache import gpu
from moecache.harness import copy_engine, paper_check


class Stream:
    def __init__(self, device=None, name="copy"):
        self.name, self.log = name, []

    def wait_event(self, event):
        self.log.append(("wait", event))


class Event:
    def __init__(self, enable_timing=False):
        self.timing, self.stream, self.at = enable_timing, None, None

    def record(self, stream):
        self.stream, self.at = stream, time.perf_counter()
        stream.log.append(("record", self))

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        assert self.timing and end.timing, "elapsed_time needs enable_timing=True"
        return 1e3 * (end.at - self.at)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams and events as stand-ins; `current` is the stream in use."""
    state = {"compute": Stream(name="compute")}
    state["current"] = state["compute"]

    @contextlib.contextmanager
    def stream(s):
        before, state["current"] = state["current"], s
        try:
            yield
        finally:
            state["current"] = before

    # Classes, as torch's: transformers annotates with `torch.cuda.Stream | None`.
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state["current"])
    monkeypatch.setattr(torch.cuda, "stream", stream)
    return state


class Link:
    def __init__(self, state):
        self.state, self.repeats = state, []

    def repeat(self, times):
        self.repeats.append((times, self.state["current"].name))


def test_a_copy_is_queued_after_the_compute_and_waited_for_between_two_events(fake_cuda):
    link = Link(fake_cuda)
    engine = copy_engine.make("cuda:0", 3, link)
    assert isinstance(engine, copy_engine.DeviceCopyEngine)
    compute, copy = fake_cuda["compute"], engine.stream
    ran = []
    ticket = engine.submit(7, lambda: ran.append(fake_cuda["current"].name))
    assert ran == ["copy"] and link.repeats == [(2, "copy")]  # the ring: m - 1 more copies
    (queued,) = [e for kind, e in compute.log if kind == "record"]
    assert copy.log == [("wait", queued), ("record", ticket.start), ("record", ticket.end)]
    assert ticket.expert == 7 and ticket.seconds() >= 0
    lap = engine.wait(ticket)
    assert compute.log[1:] == [("record", lap.start), ("wait", ticket.end), ("record", lap.end)]
    assert lap.seconds() >= 0 and fake_cuda["current"] is compute
    engine.calibrate(1, lambda i: pytest.fail("a GPU's ring needs no calibration"))
    at_1x = copy_engine.make("cuda", 1, link)
    at_1x.submit(0, lambda: None)
    assert link.repeats[-1] == (0, "copy")


def test_an_overlapped_decode_through_the_device_engine_keeps_the_blocking_run(monkeypatch):
    """The OLMoE's timed runs decoded on the CPU in the CUDA path's rehearsal (gpu.py), every
    overlapped arm's copies through DeviceCopyEngine on stand-in streams: the decode's own
    check that lossless runs keep the model's NLL passes, and the copies are the blocking
    run's."""
    engines, make = [], copy_engine.make

    def device_engine(device, multiplier, link):
        engines.append(make(device, multiplier, link))
        return engines[-1]

    monkeypatch.setattr(copy_engine, "make", device_engine)
    shrink = {
        "hidden_size": 32,
        "intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    model = dataclasses.replace(paper_check.PAPER_MODELS["olmoe"], vocab=128, shrink=shrink)
    pace = {"sequences": 2, "tokens": 8, "warmup_tokens": 1, "repeats": 1}
    with gpu.rehearse():
        report = paper_check.measure("olmoe", model, "cpu", pace, 0, lambda line: None)
    assert engines and {e.multiplier for e in engines} == {1, paper_check.SLOW_MULTIPLIER}
    assert all(isinstance(e, copy_engine.DeviceCopyEngine) for e in engines)
    rows = report["overlap"]["1"]
    assert rows["lru-overlap"]["copies_per_token"] == rows["lru"]["copies_per_token"]
    assert rows["lru-overlap"]["stall_ms"] >= 0
