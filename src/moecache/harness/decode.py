"""Teacher-forced decoding, batch 1 with the KV cache, over a shard's held-out sequences.

Several arms (the model's own blocks, or pooled blocks under one policy and copy
multiplier each) decode the same sequences in one process, interleaved: every sequence is
decoded by every arm before the next sequence starts, in an order shuffled per sequence
(seeded), so that the machine's drift falls on all arms alike. Each arm reports next-token NLL (per
sequence and token-weighted), tokens/s with a 95% interval over the sequences, copies,
copy time and compute time; a global warm-up per arm and each sequence's first token are
left out of the timing. With `repeats` > 1 every sequence is timed that many times per arm
(the median is kept); counts must come out identical each time. A sequence's row and an
arm's totals are decode_totals.py's; the whole-sequence NLL check is nll.py's.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from moecache import gpu, policies
from moecache.errors import MoecacheError
from moecache.harness import placement
from moecache.harness.decode_totals import sequence_row, totals
from moecache.harness.link import SlowLink
from moecache.harness.pool import ExpertPool, HostExperts
from moecache.harness.pooled_block import PooledMoeBlock
from moecache.harness.timing import Stopwatch
from moecache.model import memory, registry


@dataclass
class Offload:
    """The restricted layers offloaded: host experts and device slots per layer, one link."""

    model: object
    adapter: object  # the model family's (model/registry.py)
    own: dict  # layer -> the model's own MoE block
    hosts: dict  # layer -> HostExperts
    link: SlowLink
    new_link: Callable[[str], SlowLink]  # another kind of link over the same hosts

    def arm(
        self,
        name,
        make_policy,
        capacity,
        multiplier=1,
        future_of=None,
        limit=None,
        link=None,
        own_slots=False,
        block=PooledMoeBlock,
    ) -> Arm:
        """`link`: this arm's own slower link (default: the offload's); `own_slots`: slot
        storage of its own, to decode token by token beside other pooled arms; `block`: the
        pooled block's class (harness/union_block.py's for batched decoding)."""
        link = link or self.link
        hosts = {
            layer: host.own_slots(capacity) if own_slots else host
            for layer, host in self.hosts.items()
        }
        blocks = {
            layer: block(
                mlp,
                ExpertPool(hosts[layer], capacity, multiplier, link),
                placed(make_policy(), layer),
                self.adapter,
            )
            for layer, mlp in self.own.items()
        }
        return Arm(name, blocks, multiplier, future_of, limit)

    def release_slots(self) -> None:
        """The shared slot storage given back (its arms must be gone): what follows decodes
        on slots of its own (Offload.arm's own_slots)."""
        for host in self.hosts.values():
            host.slots = host.new_slots(0)
        gc.collect()  # the pools and kernels that held it, now, not at the next collection

    def device_bytes(self) -> dict:
        """What the device holds while pooled: the weights left on it (the offloaded
        experts' never counted, wherever they are), the slots, the link's rings."""
        device = next(iter(self.hosts.values())).device
        experts = [self.adapter.experts(mlp) for mlp in self.own.values()]
        offloaded = {id(p) for module in experts for p in module.parameters()}
        report = {
            "weights_bytes": sum(
                p.numel() * p.element_size()
                for p in self.model.parameters()
                if p.device.type == device.type and id(p) not in offloaded
            ),
            "offloaded_expert_bytes": sum(
                p.numel() * p.element_size() for module in experts for p in module.parameters()
            ),
            "slot_bytes": sum(host.slot_bytes for host in self.hosts.values()),
            "link_ring_bytes": self.link.nbytes,
        }
        if gpu.is_cuda(device):
            report["cuda_memory_allocated_bytes"] = torch.cuda.memory_allocated(device)
        return report


def placed(policy, layer: int):
    policy.layer = layer  # a policy with per-layer state (the controller's heads) reads it
    return policy


@dataclass
class Arm:
    name: str
    blocks: dict  # layer -> PooledMoeBlock; empty: the model's own blocks
    multiplier: int = 1
    future_of: str | None = None  # the arm whose demand, same sequence, this one reads
    limit: int | None = None  # decodes only the first this many sequences (None: all)
    rows: list = field(default_factory=list)
    traces: list = field(default_factory=list)
    demand: dict = field(default_factory=dict)  # sequence -> layer -> requested experts


@contextlib.contextmanager
def offloaded(
    model,
    layers,
    capacity: int,
    device: str,
    ring_mib: int,
    slots=None,
    link="auto",
):
    """The restricted layers' expert weights in host memory (where `jobs.load_model` put
    them, else moved there now: harness/placement.py), with `capacity` device slots per
    layer shared by the arms decoded one after another; the model's own blocks are put back
    afterwards (their experts stay on the host, staged onto the device when they run).
    `slots`: the slots a run uses in all (the link's device ring; default all of them);
    `link`: the slower link's kind (harness.slow_link, link.py)."""
    adapter = registry.of(model)
    adapter.check_sparse(model.config, layers)
    own = {layer: adapter.block(model, layer) for layer in layers}
    device = torch.device(device)
    placement.offload_experts(model, layers, device)
    placement.release_staging(model)  # pooled, the own blocks' staging is not needed
    try:
        hosts = {}
        for layer, mlp in own.items():
            hosts[layer] = HostExperts(adapter.experts(mlp), capacity, device)
        some = next(iter(hosts.values()))

        def new_link(kind):
            return SlowLink(
                some.first_expert(),
                device,
                ring_mib,
                gpu.cuda_path(device),
                slots or capacity * len(layers),
                kind,
            )

        yield Offload(model, adapter, own, hosts, new_link(link), new_link)
    finally:
        for layer, mlp in own.items():
            adapter.set_block(model, layer, mlp)


def use(model, arm: Arm, own: dict) -> None:
    """Put `arm`'s blocks into the model (the model's own where the arm has none)."""
    adapter = registry.of(model)
    for layer, mlp in own.items():
        adapter.set_block(model, layer, arm.blocks.get(layer, mlp))


def decode_one(model, arm: Arm, ids, device, future=None) -> dict:
    """One sequence under `arm` (its blocks already in the model); `future[layer]`: the
    sequence's recorded demand, for policies that read it."""
    return decode_tokens(model, [arm], ids, device, futures={arm.name: future})[arm.name]


@torch.inference_mode()
def decode_tokens(model, arms: list[Arm], ids, device, own=None, futures=None, turn=0) -> dict:
    """One sequence under each of `arms`, token by token: every arm decodes token t, in an
    order shuffled per token (seeded with `turn` and t), before any decodes t + 1, each
    with its own KV cache, so that drift at any time scale falls on all of them alike and
    no arm always follows the same neighbour. With `own` each arm's blocks are put into the
    model before each of its tokens (without, the one arm's are in already). Pooled arms
    decoded together must not share slots (`Offload.arm(own_slots=True)`)."""
    from transformers import DynamicCache

    storage = [id(block.pool.host.slots) for arm in arms for block in arm.blocks.values()]
    if len(storage) != len(set(storage)):
        raise MoecacheError(
            f"arms {', '.join(a.name for a in arms)}: pooled arms that share the slot storage "
            "cannot decode token by token together: give each its own slots"
        )
    if len(arms) > 1 and own is None:
        raise MoecacheError("decoding several arms token by token needs the model's own blocks")
    futures = futures or {}
    watch = Stopwatch(device)
    state = {}
    for arm in arms:
        future = futures.get(arm.name)
        for layer, block in arm.blocks.items():
            block.reset(future[layer] if future else None)
            block.pool.clear_counts()
        pools = [block.pool for block in arm.blocks.values()]
        state[arm.name] = {"pools": pools, "cache": DynamicCache(config=model.config)}
        state[arm.name].update(nll_sum=0.0, step_seconds=0.0, first_fills=0)
    x = torch.tensor([ids], device=device)
    shuffle = random.Random(turn)
    for t in range(len(ids)):
        for arm in shuffle.sample(arms, len(arms)) if len(arms) > 1 else arms:
            s = state[arm.name]
            if own is not None:
                use(model, arm, own)
            watch.start()
            logits = model(input_ids=x[:, t : t + 1], cache=s["cache"], use_cache=True).logits
            for pool in s["pools"]:  # an overlapped arm's copies end with its token
                pool.drain()
            seconds = watch.stop()  # waits for the device, so the copy timers can be read
            # An own block's staged experts (harness/placement.py) are not its compute.
            seconds -= placement.take_staging_seconds(model)
            if t + 1 < len(ids):
                s["nll_sum"] -= torch.log_softmax(logits[0, -1].float(), -1)[ids[t + 1]].item()
            if t == 0:  # the first token fills the empty pool and is not timed
                s["first_fills"] = sum(p.fills for p in s["pools"])
                for pool in s["pools"]:
                    pool.clear_counts()
            else:
                s["step_seconds"] += seconds
    for s in state.values():  # every arm's cache, at its longest, beside the slots
        memory.count_cache(s["cache"])
    return {arm.name: sequence_row(ids, state[arm.name]) for arm in arms}


def order(arms: list[Arm], turn: int) -> list[Arm]:
    """Arms whose demand others read go first; the rest in an order shuffled with `turn` as
    the seed. A rotation would keep each arm behind the same neighbour (a run's 10x behind
    its 1x), and what an arm leaves in the caches favours or slows the next one alike."""
    read = {arm.future_of for arm in arms}
    first = [arm for arm in arms if arm.name in read]
    rest = [arm for arm in arms if arm.name not in read]
    return first + random.Random(turn).sample(rest, len(rest))


def decode(
    model,
    sequences,
    device,
    arms: list[Arm],
    own: dict,
    warmup_tokens=16,
    repeats=1,
    seed=0,
    lockstep=False,
    demand=None,
) -> dict[str, dict]:
    """Decode every sequence under every arm, interleaved; results per arm name.
    `lockstep`: interleaved token by token (decode_tokens), not sequence by sequence; an
    arm that reads another's demand then reads it from `demand` (an arm of an earlier
    decode: its `demand`, sequence by sequence)."""
    demand = demand or {}
    here = set() if lockstep else {arm.name for arm in arms}
    for arm in arms:
        if arm.future_of is not None and arm.future_of not in here | set(demand):
            raise MoecacheError(f"run {arm.name}: reads the demand of {arm.future_of}, not here")
    try:
        # A global warm-up, not counted: every arm decodes the first tokens once.
        passes = functools.partial(lockstep_pass, demand=demand) if lockstep else one_pass
        passes(model, [sequences[0][: warmup_tokens + 1]], device, arms, own, 0, None)
        with no_cyclic_gc():
            for rep in range(repeats):
                passes(model, sequences, device, arms, own, rep, keep)
    finally:
        use(model, Arm("own", {}), own)
    return {arm.name: finish(arm, repeats, seed) for arm in arms}


@contextlib.contextmanager
def no_cyclic_gc():
    """Python's cyclic collector off while timing, as timeit does: a full collection over
    the growing traces took about 0.2 s here, landing on whichever arm was decoding (a few
    percent of one run's step time). Decoding makes next to no reference cycles."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def one_pass(model, sequences, device, arms, own, rep, record) -> None:
    label = f"pass {rep + 1}" if record else "warm-up"
    for seq, ids in enumerate(tqdm(sequences, desc=label, unit="seq")):
        demand = {}
        for arm in order(arms, seq + rep):
            if arm.limit is not None and seq >= arm.limit:
                continue
            use(model, arm, own)
            row = decode_one(model, arm, ids, device, demand.get(arm.future_of))
            demand[arm.name] = {layer: block.requested() for layer, block in arm.blocks.items()}
            if record:
                record(arm, seq, rep, row)
                arm.demand[seq] = demand[arm.name]


def lockstep_pass(model, sequences, device, arms, own, rep, record, demand=None) -> None:
    label = f"pass {rep + 1}, token by token" if record else "warm-up"
    for seq, ids in enumerate(tqdm(sequences, desc=label, unit="seq")):
        futures = {a.name: demand[a.future_of][seq] for a in arms if a.future_of}
        rows = decode_tokens(model, arms, ids, device, own, futures, turn=seq + rep)
        if record:
            for arm in arms:
                record(arm, seq, rep, rows[arm.name])


COUNTS = ("nll_sum", "timed_copies", "copy_groups", "fills", "steady")


def keep(arm: Arm, seq: int, rep: int, row: dict) -> None:
    """The first pass keeps counts, NLL and the trace; later passes only add timings."""
    if rep == 0:
        row.update(sequence=seq, step_repeats=[row["step_seconds"]])
        row["copy_repeats"] = [row["copy_seconds"]]
        arm.rows.append(row)
        for layer, block in arm.blocks.items():
            arm.traces.extend({"sequence": seq, "layer": layer, **s} for s in block.steps())
        return
    kept = arm.rows[seq]
    changed = [key for key in COUNTS if kept[key] != row[key]]
    if changed:
        raise MoecacheError(
            f"run {arm.name}: sequence {seq} gave other {', '.join(changed)} on pass {rep + 1}"
        )
    kept["step_repeats"].append(row["step_seconds"])
    kept["copy_repeats"].append(row["copy_seconds"])


def finish(arm: Arm, repeats: int, seed: int) -> dict:
    for row in arm.rows:  # the median pass of each sequence
        row["step_seconds"] = statistics.median(row["step_repeats"])
        row["copy_seconds"] = statistics.median(row["copy_repeats"])
        row["nll"] = row["nll_sum"] / row["scored"]
    return {"sequences": arm.rows, "totals": totals(arm.rows, repeats, seed), "trace": arm.traces}


def policy_factory(spec: dict, capacity: int, num_experts: int, top_k: int):
    def make():
        return policies.make(spec["policy"], capacity, num_experts, top_k, spec["params"])

    make()  # fail now, with one line, on a bad name or parameter
    return make
