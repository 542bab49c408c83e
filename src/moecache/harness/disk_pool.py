"""Experts on disk and the host cache over them (issue 40, point 3).

`write_experts` stores the restricted layers' experts in one safetensors file, one flat
tensor per expert (its parameters concatenated in the module's order), synced to disk and
dropped from the page cache. `DiskExperts` reads one expert's bytes with a real disk read:
O_DIRECT into a page-aligned buffer (the page cache never serves it), or where the
filesystem refuses O_DIRECT, a plain read after posix_fadvise(POSIX_FADV_DONTNEED) on the
range (one logged line says so). `HostCache` holds H experts of one layer in host memory,
filled from those reads; each read and its copy into the slot is timed on the monotonic
clock.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time
from pathlib import Path

import torch

PAGE = 4096  # O_DIRECT's alignment of offsets, lengths and buffers on this machine's disks
DIRECT, FADVISE = "O_DIRECT", "posix_fadvise(DONTNEED)"


def expert_key(layer: int, expert: int) -> str:
    return f"layers.{layer}.experts.{expert}"


def write_experts(path: Path, hosts: dict) -> None:
    """`hosts`: layer -> HostExperts (harness/pool.py). Synced, then evicted from the page
    cache, so the first read of every expert comes from the disk."""
    from safetensors.torch import save_file

    tensors = {
        expert_key(layer, e): torch.cat([h[e].reshape(-1) for h in host.host.values()])
        for layer, host in hosts.items()
        for e in range(host.num_experts)
    }
    save_file(tensors, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def byte_ranges(path: Path) -> dict[str, tuple[int, int]]:
    """Each tensor's [start, end) in the file, from the safetensors header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    base = 8 + size
    return {
        key: (base + meta["data_offsets"][0], base + meta["data_offsets"][1])
        for key, meta in header.items()
        if key != "__metadata__"
    }


def aligned(n: int) -> int:
    return -(-n // PAGE) * PAGE


class DiskExperts:
    """One expert's bytes per `read`, from the disk itself."""

    def __init__(self, path: Path, log=None):
        self.ranges = byte_ranges(path)
        longest = max(end - start for start, end in self.ranges.values())
        # An anonymous mapping is page-aligned, as O_DIRECT needs.
        self.buffer = mmap.mmap(-1, aligned(longest) + PAGE)
        self.fd, self.mode = open_uncached(path, self.buffer, log or print_stderr)

    def close(self) -> None:
        os.close(self.fd)
        self.buffer.close()

    def read(self, layer: int, expert: int) -> memoryview:
        """Expert's bytes (a view of the buffer, valid until the next read)."""
        start, end = self.ranges[expert_key(layer, expert)]
        low = start - start % PAGE
        length = aligned(end - low)
        if self.mode == FADVISE:
            os.posix_fadvise(self.fd, low, length, os.POSIX_FADV_DONTNEED)
        view = memoryview(self.buffer)[:length]
        got = os.preadv(self.fd, [view], low)
        if got < end - low:
            raise OSError(f"short read of {expert_key(layer, expert)}: {got} bytes")
        return view[start - low : end - low]


def print_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def open_uncached(path: Path, buffer: mmap.mmap, log) -> tuple[int, str]:
    """The file opened for reads the page cache does not serve, and how: O_DIRECT where a
    test read succeeds, else plain reads after dropping the range from the page cache."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is not None:
        try:
            fd = os.open(path, os.O_RDONLY | flag)
        except OSError as error:
            log(f"tiers harness: O_DIRECT refused on {path} ({error}); reading after {FADVISE}")
        else:
            try:
                os.preadv(fd, [memoryview(buffer)[:PAGE]], 0)
                return fd, DIRECT
            except OSError as error:
                os.close(fd)
                log(f"tiers harness: O_DIRECT read failed ({error}); reading after {FADVISE}")
    else:
        log(f"tiers harness: no O_DIRECT on this system; reading after {FADVISE}")
    return os.open(path, os.O_RDONLY), FADVISE


class HostCache:
    """H experts of one layer in host memory, slots filled from disk reads."""

    def __init__(self, host, capacity: int, layer: int, disk: DiskExperts):
        """`host`: the layer's HostExperts (its parameters' shapes and dtypes)."""
        self.layer, self.disk = layer, disk
        self.shapes = {name: h.shape[1:] for name, h in host.host.items()}
        self.dtype = next(iter(host.host.values())).dtype
        self.slots = {
            name: torch.empty((capacity, *shape), dtype=self.dtype)
            for name, shape in self.shapes.items()
        }
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        self.slot_of: dict[int, int] = {}
        self.free = list(range(self.capacity - 1, -1, -1))

    def drop(self, expert: int) -> None:
        self.free.append(self.slot_of.pop(expert))

    def read(self, expert: int) -> float:
        """Read `expert` from disk into a free slot; the seconds it took."""
        started = time.perf_counter()
        raw = torch.frombuffer(self.disk.read(self.layer, expert), dtype=self.dtype)
        slot = self.free.pop()
        at = 0
        for name, shape in self.shapes.items():
            n = shape.numel()
            self.slots[name][slot].copy_(raw[at : at + n].view(shape))
            at += n
        self.slot_of[expert] = slot
        return time.perf_counter() - started

    def tensors(self, expert: int) -> dict[str, torch.Tensor]:
        slot = self.slot_of[expert]
        return {name: slots[slot] for name, slots in self.slots.items()}
