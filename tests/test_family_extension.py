"""A new family is the files docs/adding-a-model.md counts, and no other edit: an adapter for
a transformers model_type that no adapter covers (FlexOlmo: OLMoE's router and sparse block
under a model_type of its own, so its adapter is OLMoE's renamed, with its tiny config),
written into a temporary folder on the model package's path, and its checkpoint's published
config.json in a temporary config/checkpoints/. The registry, the config's family check,
the tiny-model builder, the rehearsal builder's layout check, the gates and the plan all
pick it up. Each test removes the family again (module, path, registry), since tests share
a worker in any order."""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_ARCH, TINY_HARNESS

from moecache import config as configs
from moecache import model as package
from moecache.harness import decode, gates
from moecache.model import checkpoint, registry, tiny
from moecache.schedule import accountant

sys.path.insert(0, str(Path(__file__).parent / "rehearsal"))
import build as rehearsal  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FAMILY = "flex_olmo"
SOURCE = "example/FlexOlmo-tiny"  # a hub id: planned from its published config.json
ADAPTER = '''"""FlexOlmo (allenai/FlexOlmo-7x7B-1T): transformers' FlexOlmoSparseMoeBlock is
OLMoE's, so the base adapter is this family, under its own model_type."""

from __future__ import annotations

from moecache.model.adapter import MoeAdapter


class FlexOlmoAdapter(MoeAdapter):
    family = "flex_olmo"

    def tiny_config(self, arch, base):
        from transformers import FlexOlmoConfig

        return FlexOlmoConfig(
            **base, intermediate_size=arch["intermediate_size"], num_experts=arch["num_experts"]
        )
'''
ARCH = TINY_ARCH
LAYERS, CAPACITY, VOCAB = [1, 2], 8, 300
HARNESS = {**TINY_HARNESS, "restricted_layers": LAYERS, "capacity": CAPACITY}


def forget() -> None:
    """No trace of the family in this process: its module, the package's attribute, the
    registry (which rereads the package's folders)."""
    sys.modules.pop(f"{package.__name__}.{FAMILY}", None)
    if hasattr(package, FAMILY):
        delattr(package, FAMILY)
    registry.refresh()


@contextlib.contextmanager
def new_family(root: Path, monkeypatch):
    """The family as docs/adding-a-model.md adds one; yields the files written."""
    adapter = root / "model" / f"{FAMILY}.py"
    adapter.parent.mkdir()
    adapter.write_text(ADAPTER)
    published = root / "checkpoints" / (SOURCE.replace("/", "--") + ".json")
    published.parent.mkdir()
    try:
        package.__path__.append(str(adapter.parent))
        importlib.invalidate_caches()
        registry.refresh()
        # The checkpoint's config.json, as its hub page has it (here: the tiny model's).
        keys = tiny.config(FAMILY, ARCH, VOCAB).to_dict()
        published.write_text(json.dumps(keys, default=str))
        monkeypatch.setattr(accountant, "PUBLISHED", published.parent)
        yield [adapter, published]
    finally:
        package.__path__.remove(str(adapter.parent))
        forget()


def documented_count() -> int:
    """The file count docs/adding-a-model.md states."""
    text = (REPO / "docs" / "adding-a-model.md").read_text()
    found = re.search(r"A new family is (\w+) files?\b", text)
    assert found, "docs/adding-a-model.md no longer states how many files a family is"
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    return words[found.group(1).lower()]


def settings(source: str) -> dict:
    """A checkpoint config (config/rehearsal-qwen3.yaml's) naming the new family."""
    from conftest import load_yaml

    config = load_yaml(REPO / "config" / "rehearsal-qwen3.yaml")
    config["model"] |= {
        "source": source,
        "family": FAMILY,
        "dtype": "float32",
        "architecture": ARCH,
    }
    config["harness"] |= {"restricted_layers": LAYERS, "capacity": CAPACITY}
    return config


def test_an_unknown_family_is_refused_in_one_line():
    with pytest.raises(configs.ConfigError) as refused:
        configs.validate(settings(SOURCE))
    assert str(refused.value) == (
        f"config key model.family: {FAMILY!r} has no adapter; families with one: "
        + ", ".join(sorted(registry.ADAPTERS))
    )


def test_the_registry_the_config_and_the_tiny_builder_take_the_new_family(tmp_path, monkeypatch):
    assert FAMILY not in registry.ADAPTERS
    with new_family(tmp_path, monkeypatch) as written:
        assert len(written) == documented_count()
        assert FAMILY in registry.ADAPTERS and registry.adapter_for(FAMILY).family == FAMILY
        configs.validate(settings(SOURCE))  # the schema names no family; the registry does
        configs.validate_schema(settings(SOURCE), required=("seed", "model"))
        assert tiny.config(FAMILY, ARCH, VOCAB).model_type == FAMILY
    assert FAMILY not in registry.ADAPTERS  # and nothing of it is left behind
    assert f"{package.__name__}.{FAMILY}" not in sys.modules
    with pytest.raises(configs.ConfigError, match="has no adapter"):
        configs.validate(settings(SOURCE))


def test_the_new_family_runs_the_gates_and_the_plan(tmp_path, monkeypatch):
    with new_family(tmp_path, monkeypatch):
        model = tiny.model(FAMILY, ARCH, VOCAB, seed=0)
        with torch.no_grad():
            model.lm_head.weight.mul_(20)  # sharp, so that a routing error shows
        folder = tmp_path / "checkpoint"
        model.save_pretrained(folder)
        from safetensors import safe_open

        with safe_open(folder / "model.safetensors", "pt") as weights:
            rehearsal.check_layout(model, set(weights.keys()))  # the hub's layout
        torch.manual_seed(0)
        loaded = checkpoint.load(folder, "float32", "cpu", ARCH, family=FAMILY)
        generator = torch.Generator().manual_seed(1)
        sequences = [torch.randint(0, VOCAB, (16,), generator=generator).tolist() for _ in "ab"]
        report = gates.run(loaded, sequences, HARNESS)
        assert gates.failures(report) == []
        planned = {  # as tests/test_families.py plans, from the published config.json
            "model": settings(SOURCE)["model"],
            "harness": HARNESS,
            "corpus": {"heldout": {"max_tokens": 16}},
        }
        predicted = accountant.account(planned)
        with decode.offloaded(loaded, LAYERS, CAPACITY, "cpu", 1) as off:
            held = off.device_bytes()
        assert predicted["weights_bytes"] == held["weights_bytes"]
        assert predicted["slot_bytes"] == held["slot_bytes"]
        assert predicted["pinned_host_bytes"] == held["offloaded_expert_bytes"]
