"""The CUDA path rehearsed on a CPU (gpu.py's `rehearse`): the own blocks' experts staged onto
the device, pinned pools, the slower link's rings, the copy engine on stand-in streams and
events, the routing sent through pinned buffers. The gates, decode, batched and tiered
harness runs take those branches here for each experts kernel a config can name, at C < N and
at C = N, and the pooled blocks must equal the model's own block; no pooled kernel may keep a
hook of the model's own experts module."""

from __future__ import annotations

import gc

import pytest
import torch

from moecache import config as configs
from moecache import gpu
from moecache.config import run_spec
from moecache.harness import batched, copy_engine, decode, gates, nll, placement
from moecache.harness.overlapped_block import overlapped
from moecache.harness.pool import slot_experts
from moecache.harness.union_block import UnionBlock
from moecache.model import memory, registry, tiny
from moecache.model.kernel import PER_EXPERT
from moecache.model.memory import LEDGER
from moecache.records.gates import POOL_TOLERANCE
from moecache.schedule import accountant

ARCH = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "max_position_embeddings": 64,
}
KERNELS = (PER_EXPERT, "grouped_mm", "eager")
LAYERS = [1, 2]
SEQUENCES = [list(range(1, 14)), list(range(20, 31))]


@pytest.fixture(autouse=True)
def rehearsal():
    gc.collect()  # an earlier test's tensors leave the ledger before it is reset
    with gpu.rehearse():
        LEDGER.reset()
        yield


def random_model(kernel: str, family: str = "olmoe"):
    model = tiny.model(family, ARCH, 64, seed=3)
    model.set_experts_implementation(kernel)
    return model


def harness(capacity: int) -> dict:
    settings = {
        "device": "cpu",
        "restricted_layers": LAYERS,
        "capacity": capacity,
        "warmup_tokens": 1,
        "gate_repeats": 1,
        "min_throughput_ratio": 0.0,  # speed is not what this file checks
    }
    return configs.with_defaults(settings, "harness")


def test_a_cpu_takes_the_cuda_branches_only_in_a_rehearsal():
    assert gpu.cuda_path("cpu") and memory.slow_link_kind("auto", "cpu") == "ring"
    assert isinstance(copy_engine.make("cpu", 1, None), copy_engine.DeviceCopyEngine)
    with gpu.rehearse():
        pass
    assert gpu.rehearsing()  # the outer rehearsal is kept
    gpu.os.environ.pop(gpu.REHEARSAL_ENV)
    try:
        assert not gpu.cuda_path("cpu") and memory.slow_link_kind("auto", "cpu") == "charge"
    finally:
        gpu.os.environ[gpu.REHEARSAL_ENV] = "1"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("capacity", [6, 16], ids=["C<N", "C=N"])
def test_the_gates_pass_on_the_cuda_path_for_every_kernel(kernel, capacity):
    """LRU, dwell-1 and (with C < N) the pool at C = N equal the staged own block's NLL."""
    model = random_model(kernel)
    placement.offload_experts(model, LAYERS, "cpu")
    assert placement.staging_of(model) is not None  # the own blocks are staged
    report = gates.run(model, SEQUENCES, harness(capacity))
    assert report["failures"] == [], report["failures"]
    assert placement.take_staging_seconds(model) >= 0


@pytest.mark.parametrize("kernel", KERNELS)
@torch.inference_mode()
def test_pooled_overlapped_and_union_blocks_equal_the_own_block(kernel):
    """Tokens through the own block (staged) and through each pooled block at C < N: the
    pooled and overlapped blocks one row at a time, the union block the two rows at once."""
    model = random_model(kernel)
    placement.offload_experts(model, LAYERS, "cpu")
    x = torch.randn(2, 1, ARCH["hidden_size"], generator=torch.Generator().manual_seed(0))
    expected = registry.of(model).block(model, 1)(x)
    one = decode.policy_factory(run_spec("lru"), 6, 16, 4)
    rows = batched.policy_factory(run_spec("lru"), 6, 16, 4, size=2)
    with decode.offloaded(model, LAYERS, 6, "cpu", 8) as off:
        for kind in ({}, {"block": overlapped()}):
            block = off.arm("lru", one, 6, own_slots=True, **kind).blocks[1]
            block.reset()
            for row in range(len(x)):  # one sequence, two tokens: the second evicts
                assert torch.allclose(block(x[row : row + 1]), expected[row : row + 1], atol=1e-5)
            assert_unhooked(block.pool.kernel)
        block = off.arm("union", rows, 6, own_slots=True, block=UnionBlock).blocks[1]
        block.reset()
        assert torch.allclose(block(x), expected, atol=1e-5)
        assert_unhooked(block.pool.kernel)


def assert_unhooked(kernel) -> None:
    hooks = [name for name, value in vars(kernel).items() if "hooks" in name and value]
    assert not hooks, hooks
    assert not hasattr(kernel, "_moecache_host")


def test_no_hook_of_the_own_experts_survives_into_a_pooled_kernel():
    """A hook of any kind on the model's own experts module (the staging's and another)
    stays there and never reaches the kernel over the slots."""
    model = random_model(PER_EXPERT)
    placement.offload_experts(model, LAYERS, "cpu")
    experts = registry.of(model).layer_experts(model, 1)
    experts.register_forward_hook(lambda *a, **k: None, with_kwargs=True)
    experts.register_full_backward_hook(lambda *a: None)
    with decode.offloaded(model, LAYERS, 6, "cpu", 8) as off:
        kernel = slot_experts(off.hosts[1], 6)
        assert_unhooked(kernel)
        assert experts._forward_pre_hooks and experts._forward_hooks  # the own module's kept


@pytest.mark.parametrize("kernel", KERNELS)
def test_decoded_runs_keep_the_own_blocks_nll_on_the_cuda_path(kernel):
    """Blocking and overlapped LRU at C < N, through the slower link's rings at 2x, give the
    own block's NLL token by token, and the rings and staging are counted on the device."""
    model = random_model(kernel)
    placement.offload_experts(model, LAYERS, "cpu")
    make = decode.policy_factory(run_spec("lru"), 6, 16, 4)
    with decode.offloaded(model, LAYERS, 6, "cpu", 1) as off:
        assert off.link.kind == "ring"
        arms = [
            decode.Arm("base", {}),
            off.arm("lru", make, 6, own_slots=True),
            off.arm("lru-2x", make, 6, multiplier=2, own_slots=True),
            off.arm("overlapped", make, 6, own_slots=True, block=overlapped()),
        ]
        results = decode.decode(model, SEQUENCES, "cpu", arms, off.own, 1, lockstep=True)
        assert off.link.nbytes > 0 and "link ring" in LEDGER.peak_parts[memory.DEVICE]
    # Every arm's cache counted at its longest, all four at once.
    per_token = accountant.kv_bytes_per_token(model.config, 4)
    assert LEDGER.peak_parts[memory.DEVICE]["kv cache"] == 4 * per_token * len(SEQUENCES[0])
    base = results["base"]["totals"]["nll"]
    for name in ("lru", "lru-2x", "overlapped"):
        assert abs(results[name]["totals"]["nll"] - base) <= POOL_TOLERANCE, name
    steady = {name: results[name]["totals"]["steady_copies"] for name in ("lru", "lru-2x")}
    assert steady["lru"] == steady["lru-2x"] > 0


def test_the_gates_give_back_the_slots_before_the_whole_sequence_check(monkeypatch):
    """While the batched evaluation runs, the device holds the weights and one staged layer,
    no slot (a 24 GiB card's gates job would not fit both)."""
    model = random_model(PER_EXPERT)
    placement.offload_experts(model, LAYERS, "cpu")
    held = {}
    evaluate = nll.batched_nll

    def watched(*args):
        gc.collect()
        held.update(LEDGER.held[memory.DEVICE])
        return evaluate(*args)

    monkeypatch.setattr(nll, "batched_nll", watched)
    gates.run(model, SEQUENCES, harness(6))
    assert "slots" not in held and held  # the weights are there, the slots are not
