"""Where each weight lives: the offloaded layers' routed experts in one host copy (pinned
on CUDA), every other weight on the device, and an own block's experts staged onto the
device one layer at a time when the model's own block runs.

The whole model never sits on the device: `jobs.load_model` reads the checkpoint into host
memory (the routed experts read into place, model/expert_reader.py), `offload_experts`
pins each offloaded layer's expert tensors where they lie (gpu.pin_in_place: no second
copy; a copy, its original freed at once, only where the driver refuses), and only then
are the other weights moved. The model's own block still runs wherever it is used (the
base NLL, the gates' own-block arm): on CUDA a forward pre-hook copies that layer's N
experts into one staging buffer shared by every offloaded layer (a forward runs the layers
one after another) and a hook after it points the module back at the host copy. On a CPU
the host memory is the device's, and the own block reads the host copy directly."""

from __future__ import annotations

import torch
from torch import nn

from moecache import gpu
from moecache.harness.timing import Stopwatch
from moecache.model import registry
from moecache.model.memory import DEVICE, HOST, LEDGER


class Staging:
    """One layer's own experts on the device while its own block runs; the copies' time is
    kept so that an own-block arm's step can leave it out (`take_seconds`)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.buffer: dict[str, nn.Parameter] = {}
        self.watch = Stopwatch(self.device)
        self.laps = []

    def before(self, experts, args) -> None:
        host = experts._moecache_host
        if not self.buffer:  # allocated at first use, released while pooled (`release`)
            self.buffer = {  # counted as the Parameters that hold them
                name: LEDGER.adopt(
                    "staging",
                    DEVICE,
                    nn.Parameter(torch.empty_like(w, device=self.device), requires_grad=False),
                )
                for name, w in host.items()
            }
        self.watch.start()
        for name, weight in host.items():
            self.buffer[name].copy_(weight, non_blocking=weight.is_pinned())
        self.laps.append(self.watch.lap())
        experts._parameters = dict(self.buffer)

    def after(self, experts, args, output) -> None:
        experts._parameters = dict(experts._moecache_host)

    def release(self) -> None:
        self.buffer = {}

    def take_seconds(self) -> float:
        """The staging copies' seconds since the last call (read after the step waited)."""
        seconds = sum(lap.seconds() for lap in self.laps)
        self.laps = []
        return seconds


def host_memory_is_device(device) -> bool:
    return not gpu.cuda_path(device)


def offload_experts(model, layers, device, stage=None) -> None:
    """The routed experts of `layers` into one host copy (pinned on CUDA), layer by layer,
    counted by the accountant; a model whose experts are there already is left as it is.
    `stage`: stage an own block's experts onto the device (default: wherever the host
    memory is not the device's; tests force it on a CPU)."""
    adapter, device = registry.of(model), torch.device(device)
    pin = gpu.cuda_path(device)
    stage = not host_memory_is_device(device) if stage is None else stage
    for layer in layers:
        experts = adapter.layer_experts(model, layer)
        if hasattr(experts, "_moecache_host"):
            continue
        host = {}
        for name, weight in list(experts.named_parameters(recurse=False)):
            tensor = nn.Parameter(weight.detach().to("cpu").contiguous(), requires_grad=False)
            if pin:  # where transformers left it: no second copy of the layer
                tensor = gpu.pin_in_place(tensor)
                if not isinstance(tensor, nn.Parameter):  # pinned as a copy after all
                    tensor = nn.Parameter(tensor, requires_grad=False)
            host[name] = LEDGER.adopt("experts", HOST, tensor)
            experts._parameters[name] = host[name]  # a copy's original is freed here
        experts._moecache_host = host
        if stage:
            staging = staging_of(model, device)
            experts.register_forward_pre_hook(staging.before)
            experts.register_forward_hook(staging.after)


def staging_of(model, device=None) -> Staging | None:
    """The model's staging buffer (one per model), made on first request with `device`."""
    if getattr(model, "_moecache_staging", None) is None and device is not None:
        model._moecache_staging = Staging(device)
    return getattr(model, "_moecache_staging", None)


def offloaded_ids(model) -> set[int]:
    return {id(p) for m in model.modules() for p in getattr(m, "_moecache_host", {}).values()}


def resident_to(model, device) -> None:
    """Every weight and buffer but the offloaded experts onto `device`, counted."""
    skip, moved = offloaded_ids(model), {}  # moved: a weight tied in two modules, once
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or id(p) in skip or p.device == torch.device(device):
                continue
            if id(p) not in moved:
                moved[id(p)] = nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
            module._parameters[name] = moved[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to(device)
    for p in model.parameters():
        if id(p) not in skip:
            LEDGER.adopt("weights", DEVICE, p)


def place(model, layers, device) -> None:
    """A model read into host memory made ready for a job: the experts of `layers` offloaded
    (layer by layer), then the other weights onto the device."""
    offload_experts(model, layers, device)
    resident_to(model, device)


def take_staging_seconds(model) -> float:
    staging = staging_of(model)
    return staging.take_seconds() if staging is not None else 0.0


def release_staging(model) -> None:
    staging = staging_of(model)
    if staging is not None:
        staging.release()
