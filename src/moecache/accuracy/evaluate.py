"""Multiple-choice accuracy of the pooled model under each row's policy, through lm-eval.

The restricted layers are pooled (harness/decode.py) and each row's policy drives them;
lm-eval's HFLM scores every choice by its log-likelihood, batch 1 (padding would pass
through the routers). One forward is one question's tokens, with one choice's where the
choices are longer than a token (one-token letters share a forward: lm-eval's logits
cache). The blocks restart before each forward, as decoding restarts per sequence, so the
policy runs over the question's tokens as it would decode them (the controller keeps its
cached set, as it does across sequences); their counts after the forward are the
question's. The oracle set reads the demand free routing recorded for the same tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import decode
from moecache.runs import AccuracyRowName, HeadsName, point_name


@dataclass(frozen=True)
class Row:
    """One row of Table 2: a policy over the restricted layers."""

    name: str
    spec: dict  # {"policy": ..., "params": {...}}
    capacity: int
    reads_free: bool = False  # the oracle: reads free routing's demand on the same tokens


def rows_of(accuracy: dict, harness: dict, num_experts: int, thresholds: dict, heads) -> list[Row]:
    """Free routing (every expert resident), the oracle set and the set from recent use on
    Dwell-k's schedule (k = accuracy.switch_every, demand window accuracy.window), and each
    controller seed (`heads`: the folder of `{objective}-s{seed}.safetensors`) at the
    threshold matching that switch rate (`thresholds`: seed -> threshold) and at
    accuracy.threshold."""
    k, capacity = accuracy["switch_every"], harness["capacity"]
    window = {"k": k, "window": accuracy["window"]}
    rows = [
        Row("free", run_spec("all"), num_experts),
        Row("oracle-set", run_spec("oracle-set", window), capacity, True),
        Row("recent-use", run_spec("dwell", window), capacity),
    ]
    for label, by_seed in (
        ("matched", thresholds),
        (
            point_name(accuracy["threshold"]),
            dict.fromkeys(thresholds, accuracy["threshold"]),
        ),
    ):
        for seed, threshold in sorted(by_seed.items()):
            weights = f"{heads}/{HeadsName(accuracy['objective'], seed)}.safetensors"
            params = {"weights": weights, "threshold": threshold}
            rows.append(
                Row(
                    str(AccuracyRowName(seed, label)),
                    run_spec("controller", params),
                    capacity,
                )
            )
    return rows


def matched_thresholds(sweep: list[dict], switch_every: int) -> dict[int, float]:
    """Per seed: the threshold whose held-out refreshes per token (the controller sweep's
    unpriced results of accuracy.objective at 1x, `stage.sweep_rates`) come nearest
    1 / switch_every."""
    target, best = 1 / switch_every, {}
    for report in sweep:
        seed, threshold = report["seed"], report["threshold"]
        gap = abs(report["refreshes_per_token"] - target)
        if seed not in best or gap < best[seed][0]:
            best[seed] = (gap, threshold)
    if not best:
        raise MoecacheError("accuracy: no controller sweep results to match the switch rate")
    return {seed: threshold for seed, (_, threshold) in best.items()}


class Counter:
    """Hooks on the model: before each forward the pooled blocks restart (the oracle with
    the free demand of the same tokens); after it, that forward's counts are kept."""

    def __init__(self, model):
        self.model = model
        self.blocks, self.futures, self.reads_free, self.records = {}, {}, False, False
        self.forwards: dict[tuple, dict] = {}

    @contextlib.contextmanager
    def counting(self, blocks: dict, reads_free=False, records=False):
        """`records`: this is free routing, whose demand the oracle reads."""
        self.blocks, self.reads_free, self.records, self.forwards = blocks, reads_free, records, {}
        hooks = [
            self.model.register_forward_pre_hook(self.before, with_kwargs=True),
            self.model.register_forward_hook(self.after, with_kwargs=True),
        ]
        try:
            yield self.forwards
        finally:
            for hook in hooks:
                hook.remove()

    @staticmethod
    def key(args, kwargs) -> tuple:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[0] != 1:
            raise MoecacheError("accuracy: the pooled model scores one question at a time")
        return tuple(ids[0].tolist())

    def before(self, module, args, kwargs):
        key = self.key(args, kwargs)
        future = self.futures.get(key) if self.reads_free else None
        if self.reads_free and future is None:
            raise MoecacheError("accuracy: the oracle set needs free routing on the same tokens")
        for layer, block in self.blocks.items():
            block.reset(None if future is None else future[layer])
            block.pool.clear_counts()

    def after(self, module, args, kwargs, output):
        key = self.key(args, kwargs)
        self.forwards[key] = {
            "tokens": len(key),
            "copies": sum(b.pool.fills + b.pool.steady for b in self.blocks.values()),
            "switches": sum(b.refreshes() for b in self.blocks.values()),
        }
        if self.records:
            self.futures[key] = {layer: b.requested() for layer, b in self.blocks.items()}


def scorer(model, tokenizer, max_length: int | None):
    """lm-eval's HFLM over the in-memory model, batch 1, which records each request's
    forward tokens (lm-eval's own encoding) so that counts can be given per question."""
    from lm_eval.models.huggingface import HFLM

    class KeyedHFLM(HFLM):
        def _loglikelihood_tokens(self, requests, *args, **kwargs):
            for pair, context, continuation in requests:
                self.keys[pair] = tuple((context + continuation)[-(self.max_length + 1) :][:-1])
            return super()._loglikelihood_tokens(requests, *args, **kwargs)

    # A document starts at the boundary token (the embedded tokenizer's BOS) in training;
    # HFLM's add_bos_token reaches only a tokenizer it loads itself. A tokenizer without a
    # BOS token (OLMoE's) is left as it is.
    bos = tokenizer.bos_token is not None
    if bos:
        tokenizer.add_bos_token = True
    lm = KeyedHFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=1,
        add_bos_token=bos,
        max_length=max_length,
    )
    lm.keys = {}
    return lm


def choice_pairs(sample: dict) -> list[tuple[str, str]]:
    """The (context, continuation) pairs lm-eval scored for one sample, in choice order."""
    args = sample["arguments"]
    if isinstance(args, dict):  # {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
        return [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]


def questions(result: dict, task: str, lm, forwards: dict, row: str, layers: int) -> pd.DataFrame:
    """One row per question: choice log-likelihoods, prediction, correctness and the
    question's tokens, switches and copies (each distinct forward counted once)."""
    out = []
    for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"]):
        lls = [float(r[0]) for r in sample["filtered_resps"]]
        keys = list(dict.fromkeys(lm.keys[pair] for pair in choice_pairs(sample)))
        counts = [forwards[key] for key in keys]
        tokens = sum(c["tokens"] for c in counts)
        switches = sum(c["switches"] for c in counts)
        out.append(
            {
                "row": row,
                "task": task,
                "question": str(sample["doc"].get("id", sample["doc_id"])),
                "loglikelihoods": lls,
                "prediction": int(np.argmax(lls)),
                "answer": int(sample["target"]),
                "correct": bool(sample["acc"]),
                "tokens": tokens,
                "switches": switches,
                "switch_rate": switches / (tokens * layers),
                "copies": sum(c["copies"] for c in counts),
            }
        )
    return pd.DataFrame(out)


def evaluate_rows(
    model,
    tokenizer,
    task_dict: dict,
    rows: list[Row],
    harness: dict,
    arch: dict,
    max_length=None,
    limit=None,
) -> pd.DataFrame:
    """Every row on every task of `task_dict`: one frame of per-question outputs. Free
    routing runs first (the oracle reads its demand)."""
    from lm_eval.evaluator import evaluate

    if rows and rows[0].name != "free":
        raise MoecacheError("accuracy: free routing must be the first row (the oracle reads it)")
    layers = harness["restricted_layers"]
    most = max(row.capacity for row in rows)
    lm = scorer(model, tokenizer, max_length)
    counter = Counter(model)
    frames = []
    with decode.offloaded(model, layers, most, harness["device"], 1) as off:
        for row in rows:
            make = decode.policy_factory(
                row.spec, row.capacity, arch["num_experts"], arch["num_experts_per_tok"]
            )
            arm = off.arm(row.name, make, row.capacity)
            decode.use(model, arm, off.own)
            try:
                with counter.counting(arm.blocks, row.reads_free, row.name == "free") as forwards:
                    result = evaluate(
                        lm=lm,
                        task_dict=task_dict,
                        limit=limit,
                        log_samples=True,
                        bootstrap_iters=0,  # intervals are ours, over the same questions
                        verbosity="ERROR",
                    )
            finally:
                decode.use(model, decode.Arm("own", {}), off.own)
            for task in task_dict:
                frames.append(questions(result, task, lm, forwards, row.name, len(layers)))
    return pd.concat(frames, ignore_index=True)
