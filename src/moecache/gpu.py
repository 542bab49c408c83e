"""The CUDA calls the harness makes, in one place, and their rehearsal on a CPU.

A CUDA run takes branches a CPU run skips: an own block's experts staged onto the device one
layer at a time, pinned host pools, the slower link's rings, a copy engine on a stream of its
own, CUDA events for every timer, the routing sent to the device through pinned buffers.
Every module asks `cuda_path(device)` which branch to take, and makes its streams, events and
pinned buffers here.

`rehearse()` (or MOECACHE_REHEARSE_CUDA=1, which a job started from a test inherits) makes a
CPU device take every one of those branches on CPU tensors, so that a machine without a GPU
runs the code a GPU user runs: streams and events are stand-ins timed on the monotonic clock
(work is done when it is queued, so waiting on one is a no-op), and pinning is left out
(pinning needs a CUDA driver); the rest is the CUDA path's own code.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref

import torch

REHEARSAL_ENV = "MOECACHE_REHEARSE_CUDA"


def rehearsing() -> bool:
    return os.environ.get(REHEARSAL_ENV) == "1"


@contextlib.contextmanager
def rehearse():
    """A CPU device takes the CUDA branches inside (and in jobs started inside)."""
    before = os.environ.get(REHEARSAL_ENV)
    os.environ[REHEARSAL_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[REHEARSAL_ENV]
        else:
            os.environ[REHEARSAL_ENV] = before


def is_cuda(device) -> bool:
    """A real CUDA device."""
    return torch.device(device).type == "cuda"


def cuda_path(device) -> bool:
    """Whether work on `device` takes the CUDA branches: on CUDA, or on a CPU in rehearsal."""
    device = torch.device(device)
    return device.type == "cuda" or (device.type == "cpu" and rehearsing())


def is_pinned(tensor: torch.Tensor) -> bool:
    """In page-locked host memory; in a rehearsal every host tensor counts as pinned."""
    return tensor.is_pinned() or (rehearsing() and tensor.device.type == "cpu")


def pin(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in page-locked host memory, a copy (as it is in a rehearsal: no driver to pin
    with, and a copy the CUDA path does not make would be counted twice)."""
    if is_pinned(tensor) or not torch.cuda.is_available():
        return tensor
    return tensor.pin_memory()


def pin_in_place(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` page-locked where it lies (cudaHostRegister), no second copy of it held
    while it is pinned; unregistered when `tensor` (the object the caller keeps: a
    Parameter) is collected, before its memory is freed. A tensor that is not the whole of
    its own storage (a view into a mapped checkpoint file), or that the driver refuses to
    register, is pinned as a copy (`pin`). In a rehearsal, as `pin`: the tensor itself."""
    if is_pinned(tensor) or not torch.cuda.is_available():
        return tensor
    nbytes = tensor.numel() * tensor.element_size()
    own = tensor.is_contiguous() and tensor.untyped_storage().nbytes() == nbytes
    cudart = torch.cuda.cudart()
    if not own or nbytes == 0 or int(cudart.cudaHostRegister(tensor.data_ptr(), nbytes, 0)):
        clear = getattr(cudart, "cudaGetLastError", None)  # a refused register's error
        if own and clear is not None:
            clear()
        return pin(tensor)
    weakref.finalize(tensor, cudart.cudaHostUnregister, tensor.data_ptr())
    return tensor


def empty_pinned(shape, dtype) -> torch.Tensor:
    """A new tensor allocated in page-locked host memory (not pinned as a copy of an
    unpinned one: the two would be alive at once); in a rehearsal, as `pin`: plain."""
    page_locked = torch.cuda.is_available() and not rehearsing()
    return torch.empty(shape, dtype=dtype, pin_memory=page_locked)


class StandInEvent:
    """A CUDA event on a CPU: recorded at the moment the work before it is done (a CPU
    finishes work as it queues it)."""

    def __init__(self, enable_timing: bool = False):
        self.at: float | None = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing left to wait for."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: StandInEvent) -> float:
        """Milliseconds from this event to `end`, as torch.cuda.Event.elapsed_time."""
        return (end.at - self.at) * 1e3


class StandInStream:
    """A CUDA stream on a CPU: its work runs in order as it is queued, so waiting is free."""

    def __init__(self, device=None):
        self.device = device

    def wait_event(self, event) -> None:
        """The event's work is done already."""

    def synchronize(self) -> None:
        """Nothing queued."""


COMPUTE = StandInStream()  # the stand-in for the current (compute) stream


def event(device, timing: bool = True):
    return torch.cuda.Event(enable_timing=timing) if is_cuda(device) else StandInEvent(timing)


def new_stream(device):
    return torch.cuda.Stream(device) if is_cuda(device) else StandInStream(device)


def current_stream(device):
    return torch.cuda.current_stream(device) if is_cuda(device) else COMPUTE


def on_stream(stream):
    """Queue the work inside on `stream`."""
    if isinstance(stream, StandInStream):
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


def synchronize(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)
