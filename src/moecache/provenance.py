"""What every results file records so a number can be traced to its inputs."""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata

from moecache.atomic import write_json
from moecache.records.io import write_record

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


def sources(paths) -> dict:
    """What a table or figure came from: every input file (path, SHA-256, and the config
    hash and device its own results record), the config hashes and devices among them, and
    the package versions that built it."""
    inputs = []
    for path in paths:
        entry = digest(path)
        if str(path).endswith(".json"):
            recorded = json.loads(open(path).read())
            for key in ("run", "multiplier", "settings_hash", "device_name"):
                if key in recorded:
                    entry[key] = recorded[key]
        inputs.append(entry)
    return {
        "config_hashes": sorted({e["settings_hash"] for e in inputs if "settings_hash" in e}),
        "devices": sorted({e["device_name"] for e in inputs if "device_name" in e}),
        "versions": versions(),
        "inputs": inputs,
    }


def write_results(
    path, report: dict, settings=None, device=None, origin=None, inputs=None, kind=None
) -> dict:
    """The one way a results file is written: the numbers in `report`, then what they come
    from: the settings and machine that computed them (`settings`, `device`), or for numbers
    computed from a trace alone the run that recorded it (`origin`); the input files by
    SHA-256 (`inputs`); the package versions. `kind`: the record the file holds
    (records/), written through records/io with its schema version first. Atomic; `path`
    None writes nothing."""
    if settings is not None:
        report.update(stamp(settings, device))
    report.update(origin or {})
    if inputs is not None:
        report["inputs"] = [digest(p) for p in inputs]
    report["versions"] = versions()
    if kind is not None:
        return write_record(path, kind(**report))
    if path is not None:
        write_json(path, report)
    return report
