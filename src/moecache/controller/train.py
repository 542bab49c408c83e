"""Training the controller's heads over the frozen model, with one of two objectives.

differentiable: next-token NLL backpropagated through the soft cache (mixture.soft_cache),
plus penalties on refreshes, experts brought in ("changed"), requested experts the cache
lacks ("misses"), undecided beta (beta(1 - beta)) and the KL from the router's own
distribution to the restricted one.
reinforce: REINFORCE on hard decisions drawn from the heads (mixture.sampled_cache). Each
sequence's cost is its NLL plus the same refresh, changed and miss penalties; the reward is
minus that cost, the batch mean its baseline, and an entropy bonus keeps the heads from
collapsing early.
Priced (`price` e given): the changed-expert penalty, the traffic, becomes e * tau nats per
copied expert, tau this machine's measured time per copy in ms (the bandwidth file).
Penalties are summed over the restricted layers and averaged over tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from moecache.atomic import atomic_file
from moecache.controller.mixture import ControlledBlock
from moecache.errors import MoecacheError
from moecache.model import registry
from moecache.policies import controller_heads as heads_file
from moecache.records.controller import HeadsLog
from moecache.records.io import write_record

OBJECTIVES = {"differentiable": "soft", "reinforce": "sampled"}
PENALTIES = ("refresh", "changed", "misses")


def windows(tok, docs: list[dict], length: int, count: int, seed: int) -> torch.Tensor:
    """`count` training windows of `length` tokens, drawn (seeded) from the documents'
    token stream."""
    from moecache.data.tokenizer import document_ids

    stream = [i for doc in docs for i in document_ids(tok, doc["text"])]
    if len(stream) < 2 * length:
        raise MoecacheError(f"controller: training text has {len(stream)} tokens, too few")
    starts = np.random.default_rng(seed).integers(0, len(stream) - length, size=count)
    return torch.tensor([stream[s : s + length] for s in starts])


def new_heads(model, layers: list[int]):
    """Heads whose selection starts as the layer's router (scores = router logits), so an
    untrained controller caches the experts the current token ranks highest."""
    adapter = registry.of(model)
    sizes = adapter.sizes(model.config)
    heads = heads_file.Heads(layers, sizes.hidden_size, sizes.num_experts)
    with torch.no_grad():
        for layer in layers:
            router = adapter.layer_router(model, layer).weight.float()
            heads.mu[str(layer)].weight.copy_(router)
            heads.mu[str(layer)].bias.zero_()
    return heads


class Installed:
    """The controlled blocks in the model's restricted layers, the model's own put back
    on exit."""

    def __init__(self, model, heads, layers, capacity, mode, temperature):
        self.model, self.layers = model, layers
        self.adapter = adapter = registry.of(model)
        self.own = {layer: adapter.block(model, layer) for layer in layers}
        self.blocks = {
            layer: ControlledBlock(
                self.own[layer], adapter, heads, layer, capacity, mode, temperature
            )
            for layer in layers
        }

    def __enter__(self):
        for layer, block in self.blocks.items():
            self.adapter.set_block(self.model, layer, block)
        return self

    def __exit__(self, *exc):
        for layer, mlp in self.own.items():
            self.adapter.set_block(self.model, layer, mlp)

    def summed(self, key: str) -> torch.Tensor:
        return sum(block.stats[key] for block in self.blocks.values())


def objective(model, installed: Installed, x, weights: dict, kind: str):
    """(loss to minimise, its parts as floats) on token windows x [B, T]."""
    logits = model(input_ids=x).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none"
    ).view(x.shape[0], -1)
    parts = {key: installed.summed(key) for key in PENALTIES}
    penalty = sum(weights[key] * parts[key] for key in PENALTIES)  # [B, T]
    if kind == "differentiable":
        undecided, kl = installed.summed("undecided"), installed.summed("kl")
        loss = (
            nll.mean()
            + penalty.mean()
            + weights["undecided"] * undecided.mean()
            + weights["kl"] * kl.mean()
        )
        cost = loss
    else:
        cost_each = nll.mean(1) + penalty.mean(1)  # per sequence
        advantage = (cost_each - cost_each.mean()).detach()
        loss = (advantage * installed.summed("logp")).mean() - weights[
            "entropy"
        ] * installed.summed("entropy").mean()
        cost = cost_each.mean()
    found = {"objective": cost.detach().item(), "nll": nll.detach().mean().item()}
    found |= {key: parts[key].detach().mean().item() for key in PENALTIES}
    return loss, found


def train(settings, kind, seed, price, model_source, tokenizer_source, text_path, tau_ms, out):
    """Train one heads file; `price` e (None: the hand-set traffic weight)."""
    from moecache.data import corpus, tokenizer
    from moecache.harness import jobs

    if kind not in OBJECTIVES:
        raise MoecacheError(
            f"controller: unknown objective {kind!r} (known: {', '.join(OBJECTIVES)})"
        )
    ctl, harness = settings["controller"], settings["harness"]
    torch.set_num_threads(ctl["threads"])
    torch.manual_seed(seed)
    # The heads train through every layer's own experts: the whole model on the device.
    model = jobs.load_model(settings, model_source, harness["device"], offload=False)
    model.requires_grad_(False)
    model.eval()
    layers = harness["restricted_layers"]
    heads = new_heads(model, layers).to(harness["device"])
    weights = dict(ctl["weights"])
    if price is not None:
        weights["changed"] = price * tau_ms
    x = windows(
        tokenizer.load(tokenizer_source),
        corpus.read(text_path),
        ctl["seq_len"],
        ctl["batch_size"] * ctl["steps"],
        seed,
    ).to(harness["device"])
    optimizer = torch.optim.Adam(heads.parameters(), lr=ctl["lr"])
    log, began = [], time.monotonic()
    with Installed(
        model, heads, layers, harness["capacity"], OBJECTIVES[kind], ctl["temperature"]
    ) as installed:
        for step, batch in enumerate(x.split(ctl["batch_size"])):
            loss, found = objective(model, installed, batch, weights, kind)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.append({"step": step, **found})
    meta = {
        "objective": kind,
        "seed": seed,
        "price": price,
        "tau_ms": tau_ms,
        "weights": weights,
        "capacity": harness["capacity"],
        "steps": len(log),
        "train_seconds": time.monotonic() - began,
    }
    out = Path(out)
    with atomic_file(out) as tmp:
        heads_file.save(heads.cpu(), tmp, meta)
    write_record(out.with_suffix(".json"), HeadsLog(**meta, log=log))
    return {**meta, "log": log}
