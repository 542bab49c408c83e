"""What the device holds while restricted layers are pooled, against the harness's own
account, `moecache plan`'s prediction and (on a GPU) torch.cuda.memory_allocated."""

from __future__ import annotations

import torch

from moecache.harness import decode
from moecache.schedule import accountant


def pooled_memory(model, layers, capacity: int, device: str, ring_mib: int) -> dict:
    """What the device holds while `layers` are pooled at `capacity` slots: the weights
    left on it plus the slots (and the link's ring), and whether the pooled layers' own
    expert weights left it; on a GPU beside torch.cuda.memory_allocated."""
    device = torch.device(device)
    cuda = device.type == "cuda"

    def allocated() -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)

    def nbytes(params) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    report = {"restricted_layers": list(layers), "capacity": capacity}
    if cuda:
        report["allocated_unpooled_bytes"] = allocated()
    with decode.offloaded(model, layers, capacity, str(device), ring_mib) as off:
        modules = [off.adapter.experts(mlp) for mlp in off.own.values()]
        offloaded = [p for experts in modules for p in experts.parameters()]
        ids = {id(p) for p in offloaded}
        kept = [p for p in model.parameters() if id(p) not in ids]
        report.update(
            {
                "offloaded_expert_bytes": nbytes(offloaded),
                "offloaded_experts_on_host": all(p.device.type == "cpu" for p in offloaded),
                "other_weights_on_device": all(same_device(p.device, device) for p in kept),
                "weights_bytes": nbytes(kept),
                "slot_bytes": sum(host.slot_bytes for host in off.hosts.values()),
                "link_ring_bytes": off.link.nbytes,
                "harness_device_bytes": off.device_bytes(),  # the harness's own account
            }
        )
        report["held_bytes"] = report["weights_bytes"] + report["slot_bytes"]
        # `moecache plan`'s prediction, from the model's config alone.
        element = next(iter(model.parameters())).element_size()
        planned = accountant.held(model.config, layers, capacity, element)["held_bytes"]
        report["planned_held_bytes"] = planned
        report["plan_matches"] = planned == report["held_bytes"]
        if cuda:
            report["allocated_pooled_bytes"] = allocated()
            # Model unpooled, less the experts that left, plus slots and the link's ring.
            expected = (
                report["allocated_unpooled_bytes"]
                - report["offloaded_expert_bytes"]
                + report["slot_bytes"]
                + report["link_ring_bytes"]
            )
            report["allocated_pooled_expected_bytes"] = expected
            report["allocated_pooled_excess_bytes"] = report["allocated_pooled_bytes"] - expected
    if cuda:
        report["allocated_after_bytes"] = allocated()
        report["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return report


def same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:N` alike when N is the current device."""

    def index(d):
        return torch.cuda.current_device() if d.type == "cuda" and d.index is None else d.index

    return a.type == b.type and index(a) == index(b)
