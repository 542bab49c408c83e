"""Every family with an adapter, exact offline: a tiny randomly initialised checkpoint of each,
built from transformers' own config class and saved with `save_pretrained` in the hub's
on-disk layout (safetensors, with a tokenizer), loaded back through the pipeline's loader;
then the gates (LRU, Dwell-1 window 1 and the pool at C = N equal the unmodified model's
NLL, float32), lossless copies equal to the replay's, restricted routing equal to the
model's own router with the other experts masked before its top-k, and the plan's bytes
equal to what the harness holds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_ARCH, TINY_HARNESS

from moecache.config import ConfigError
from moecache.errors import MoecacheError
from moecache.harness import decode, gates
from moecache.model import checkpoint, registry, tiny
from moecache.schedule import accountant

sys.path.insert(0, str(Path(__file__).parent / "rehearsal"))
import build as rehearsal  # noqa: E402

from moecache.config import run_spec

FAMILIES = sorted(registry.ADAPTERS)
ARCH = TINY_ARCH
LAYERS, CAPACITY = [1, 2], 8
HARNESS = {**TINY_HARNESS, "restricted_layers": LAYERS, "capacity": CAPACITY}


@pytest.fixture(scope="module")
def tokenizer():
    return rehearsal.tokenizer(rehearsal.documents(8, 600), vocab_size=300)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tokenizer, tmp_path_factory):
    """(family, folder): the tiny checkpoint, its output head sharpened so that the NLL is
    far from uniform and a routing error shows in it."""
    family = request.param
    model = tiny.model(family, ARCH, len(tokenizer), seed=0, tok=tokenizer)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return family, folder


def load(family, folder):
    torch.manual_seed(0)
    return checkpoint.load(folder, "float32", "cpu", ARCH, family=family)


def sequences(count=2, length=16):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 290, (length,), generator=generator).tolist() for _ in range(count)]


def test_the_checkpoint_is_in_the_hub_layout_and_loads_back(saved):
    from safetensors import safe_open

    family, folder = saved
    with safe_open(folder / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    hub_name = registry.adapter_for(family).hub_expert.format(layer=1, expert=0)
    assert hub_name in names, sorted(names)[:12]
    model = load(family, folder)
    assert model.config.model_type == family
    assert registry.of(model).family == family


def test_gates_pass_in_float32(saved):
    family, folder = saved
    model = load(family, folder)
    report = gates.run(model, sequences(), HARNESS)
    assert gates.failures(report) == []
    uniform = np.log(model.config.vocab_size)
    assert abs(report["base"]["nll"] - uniform) > 1  # sharp: a routing error would show
    for name, run in report["runs"].items():  # in float32, far inside the gates' tolerance
        assert run["nll"] == pytest.approx(report["base"]["nll"], abs=1e-4), name


def test_lossless_copies_equal_the_replay(saved):
    from moecache.router_tuning.reward import lru_counts

    family, folder = saved
    model = load(family, folder)
    sizes = registry.of(model).sizes(model.config)
    make = decode.policy_factory(run_spec("lru"), CAPACITY, sizes.num_experts, 4)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        arm = off.arm("lru", make, CAPACITY)
        result = decode.decode(model, sequences(), "cpu", [arm], off.own, warmup_tokens=2)
        demand = arm.demand
    streams = [
        np.asarray(demand[s][layer], dtype=np.int64) for layer in LAYERS for s in sorted(demand)
    ]
    counts, _ = lru_counts(streams, CAPACITY, sizes.num_experts, keep=False)
    got = result["lru"]["totals"]
    assert (int(counts.fills.sum()), int(counts.steady.sum())) == (
        got["fills"],
        got["steady_copies"],
    )
    assert got["steady_copies"] > 0


def masked_topk(allowed, outside: list):
    """torch.topk that masks the disallowed experts of any [.., N] input first: the model's
    own router code, with the other experts removed just before its selection. `outside`
    gets, per call, the rows that had to take a masked expert (fewer than k left)."""
    real = torch.topk

    def topk(x, k, dim=-1, **kwargs):
        if x.shape[-1] != allowed.shape[-1]:
            return real(x, k, dim=dim, **kwargs)
        found = real(x.masked_fill(~allowed, float("-inf")), k, dim=dim, **kwargs)
        outside.append((found.values == float("-inf")).any(dim=-1))
        return found

    return topk


def test_restricted_routing_is_the_models_own_among_the_allowed(saved, monkeypatch):
    family, folder = saved
    model = load(family, folder)
    adapter = registry.of(model)
    block = adapter.block(model, LAYERS[0])
    router = adapter.router(block)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(12, ARCH["hidden_size"], generator=generator)
    compared = 0
    for _ in range(8):
        chosen = torch.randperm(ARCH["num_experts"], generator=generator)[:CAPACITY]
        allowed = torch.zeros(1, ARCH["num_experts"], dtype=torch.bool)
        allowed[0, chosen] = True
        with torch.no_grad():
            logits, _, _ = adapter.route(block, x)
            weights, index = adapter.restrict(block, logits, allowed.expand(len(x), -1))
            assert allowed[0, index].all()  # never an expert that is not resident
            with monkeypatch.context() as patch:
                outside = []
                patch.setattr(torch, "topk", masked_topk(allowed, outside))
                _, ref_weights, ref_index = router(x)
        for t in range(len(x)):
            if outside[-1][t]:
                continue  # the model itself would reach outside (DeepSeek's group limit)
            order, ref_order = index[t].argsort(), ref_index[t].argsort()
            assert index[t][order].tolist() == ref_index[t][ref_order].tolist()
            torch.testing.assert_close(
                weights[t][order].float(), ref_weights[t][ref_order].float(), rtol=1e-5, atol=1e-6
            )
            compared += 1
    assert compared >= 48


def test_the_plan_predicts_the_bytes_the_harness_holds(saved):
    family, folder = saved
    settings = {
        "model": {
            "source": str(folder),
            "family": family,
            "dtype": "float32",
            "architecture": ARCH,
        },
        "harness": HARNESS,
        "corpus": {"heldout": {"max_tokens": 16}},
    }
    predicted = accountant.account(settings)
    model = load(family, folder)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        held = off.device_bytes()
    assert predicted["weights_bytes"] == held["weights_bytes"]
    assert predicted["slot_bytes"] == held["slot_bytes"]
    assert predicted["pinned_host_bytes"] == held["offloaded_expert_bytes"]
    # The GPU check's account of the same (run here on the CPU) says it matches.
    from moecache.harness.pooled_memory import pooled_memory

    memory = pooled_memory(model, LAYERS, CAPACITY, "cpu", 1)
    assert memory["plan_matches"] and memory["planned_held_bytes"] == predicted["held_bytes"]
    adapter = registry.of(model)
    shared = adapter.shared_modules(adapter.block(model, LAYERS[0]))
    assert (predicted["shared_expert_bytes"] > 0) == bool(shared)


# --- bad input ---------------------------------------------------------------------------


def test_an_architecture_without_an_adapter_is_refused_naming_those_with_one():
    with pytest.raises(MoecacheError, match="'llama' has no adapter; families with one: "):
        registry.adapter_for("llama")


def test_a_dense_restricted_layer_is_refused(tokenizer):
    model = tiny.model("qwen3_moe", ARCH, len(tokenizer), seed=0)  # layer 0 is dense
    with pytest.raises(MoecacheError, match="layer 0 of this qwen3_moe model is dense"):
        with decode.offloaded(model, [0, 1], CAPACITY, "cpu", 1):
            pass


def test_a_checkpoint_of_another_family_is_refused(saved):
    family, folder = saved
    other = "mixtral" if family != "mixtral" else "olmoe"
    with pytest.raises(MoecacheError, match=f"model.family is '{other}'"):
        checkpoint.load(folder, "float32", "cpu", ARCH, family=other)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"harness": {"capacity": 64}}, "capacity 64 must be below num_experts 64"),
        ({"harness": {"capacity": 4}}, "top-k 8 is larger than capacity 4"),
        ({"model": {"family": "gpt_oss"}}, "the embedded model is an olmoe"),
    ],
)
def test_config_refuses_capacities_and_families_that_cannot_run(change, message):
    from conftest import load_yaml

    from moecache import config as configs

    settings = load_yaml(Path(__file__).parents[1] / "config" / "config.yaml")
    for section, keys in change.items():
        settings[section] |= keys
    with pytest.raises(ConfigError, match=message):
        configs.validate(settings)


def test_a_family_refuses_a_stage_it_cannot_run():
    from conftest import load_yaml

    from moecache import config as configs

    settings = load_yaml(Path(__file__).parents[1] / "config" / "rehearsal.yaml")
    settings["model"]["family"] = "gpt_oss"
    with pytest.raises(ConfigError, match="config key controller: the gpt_oss family cannot"):
        configs.validate(settings)


def test_no_module_outside_model_names_a_family_specific_module_or_parameter():
    """Everything reaches the model through its family's adapter (src/moecache/model/)."""
    import re

    specific = re.compile(
        r"Olmoe[A-Z]\w*|modeling_olmoe|\.mlp\b|mlp\.gate|model\.model\.layers|"
        # shared_expert_bytes is the plan's own report key (schedule/accountant.py), not a module
        r"block_sparse_moe|shared_expert(?!_bytes)|e_score_correction_bias|mlp\.router"
    )
    source = Path(__file__).parents[1] / "src" / "moecache"
    found = [
        f"{path.relative_to(source)}:{number}: {line.strip()}"
        for path in sorted(source.rglob("*.py"))
        if path.parent.name != "model"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if specific.search(line)
    ]
    assert found == []
