"""Where a checkpoint's files lie (a local folder, or the hub snapshot from_pretrained has
fetched) and its safetensors tensors read by name, never unpickled."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from moecache.errors import MoecacheError


class Tensors:
    """A checkpoint's safetensors, read by name (never unpickled), each file opened once."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        self.opened: dict[Path, safe_open] = {}
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {name: folder / file for name, file in weight_map.items()}
        else:
            self.files = {
                name: file
                for file in sorted(folder.glob("*.safetensors"))
                for name in self.handle(file).keys()
            }

    def handle(self, file: Path):
        if file not in self.opened:
            self.opened[file] = safe_open(file, "pt")
        return self.opened[file]

    def get(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise MoecacheError(f"checkpoint has no tensor {name} (its quantization wants it)")
        return self.handle(self.files[name]).get_tensor(name)

    def stacked(self, names: list[str]) -> torch.Tensor:
        """[len(names), ...]: one tensor per expert, stacked into one allocation."""
        first = self.get(names[0])
        out = torch.empty((len(names), *first.shape), dtype=first.dtype)
        out[0] = first
        for e, name in enumerate(names[1:], 1):
            out[e] = self.get(name)
        return out


def checkpoint_folder(source) -> Path:
    """A local folder, or the hub snapshot that from_pretrained has already fetched."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(source), allow_patterns=["*.safetensors", "*.json"]))
