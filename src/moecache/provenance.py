"""What every results file records so a number can be traced to its inputs."""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata

PACKAGES = ("moecache", "torch", "transformers", "datasets", "numpy", "libcachesim")


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def stamp(settings: dict, device: str) -> dict:
    return {
        "settings": settings,
        "settings_hash": settings_hash(settings),
        "versions": versions(),
        "device": device,
        "device_name": device_name(device),
    }


def digest(path) -> dict:
    """A results file's record of one input: its path and SHA-256."""
    from pathlib import Path

    return {"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
