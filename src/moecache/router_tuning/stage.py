"""The stage's jobs, one per rule: fine-tune and merge one variant; measure one model (the
untuned base or a merged variant) in the harness."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from moecache import provenance
from moecache.atomic import atomic_dir
from moecache.errors import MoecacheError
from moecache.records.io import read_dict
from moecache.records.router_tuning import TunedModel, TuningLog

MODELS = ("base", "sft", "hit", "tag", "harness")
# Largest logit difference allowed between the merged and the adapter model: fp32 folds the
# adapters in exactly up to rounding; 16-bit weights round each merged weight once more.
MERGE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}
TRAINING_LOG = "training.json"


def setup(settings: dict, model_source, tokenizer_source):
    from moecache.data import tokenizer
    from moecache.harness import jobs

    torch.set_num_threads(settings["router_tuning"]["threads"])
    torch.manual_seed(settings["seed"])
    # LoRA trains through the experts: the whole model on the device.
    model = jobs.load_model(settings, model_source, settings["harness"]["device"], offload=False)
    return model, tokenizer.load(tokenizer_source)


def simulated(model, tok, rows: list[dict], settings: dict) -> float:
    """The reward's hit rate at the trained layer and capacity on greedy continuations of
    `rows`' prompts: a deterministic start and end point for every variant's log."""
    from moecache.router_tuning import measure, reward

    tuning, device = settings["router_tuning"], settings["harness"]["device"]
    prompts = [tok(text=r["prompt"])["input_ids"] for r in rows]
    was_training = model.training
    model.eval()
    texts = measure.generate(model, prompts, tuning["completion_tokens"], tok.pad_token_id, device)
    requests = reward.routing(model, texts, [tuning["layer"]], device)[tuning["layer"]]
    experts = settings["model"]["architecture"]["num_experts"]
    rates = reward.hit_rates(requests, list(map(len, prompts)), tuning["capacity"], experts)
    model.train(was_training)
    return float(rates.mean())


def fine_tune(settings, variant, model_source, tokenizer_source, text_path, out_dir) -> dict:
    """One variant fine-tuned, merged and saved (safetensors): out_dir/model (weights and
    tokenizer), out_dir/adapter (the LoRA adapters) and out_dir/training.json."""
    from moecache.data import corpus
    from moecache.router_tuning import prompts, train

    if variant not in train.VARIANTS:
        raise MoecacheError(f"variant {variant!r}: one of {', '.join(train.VARIANTS)}")
    started = time.perf_counter()
    tuning, device = settings["router_tuning"], settings["harness"]["device"]
    model, tok = setup(settings, model_source, tokenizer_source)
    rows = prompts.build(corpus.read(text_path), tok, tuning, settings["seed"], variant == "tag")
    check = rows[: tuning["eval_prompts"]]
    before = simulated(model, tok, check, settings)
    tuned, steps = train.train(variant, model, tok, rows, settings)
    after = simulated(tuned, tok, check, settings)
    with atomic_dir(out_dir) as tmp:
        tuned.save_pretrained(tmp / "adapter")  # safetensors, peft's default
        merged, gap = train.merge(tuned, tok(text=rows[0]["prompt"])["input_ids"], device)
        if gap > MERGE_TOLERANCE[settings["model"]["dtype"]]:
            raise MoecacheError(f"variant {variant}: merged logits differ by {gap:.2e}")
        merged.save_pretrained(tmp / "model", safe_serialization=True)
        tok.save_pretrained(tmp / "model")
        log = [
            {key: entry[key] for key in ("step", "loss", "reward", "sim_hit_rate") if key in entry}
            for entry in steps
        ]
        report = {
            "variant": variant,
            "source": str(model_source),
            "steps": len(log),
            "prompts": len(rows),
            "completions_per_step": (
                tuning["prompts_per_step"] * (1 if variant == "sft" else tuning["num_generations"])
            ),
            # The training log's simulated hit rate and reward (GRPO only), first and last
            # quarter of the steps: one step's batch is a few prompts.
            "log_sim_hit_rate": ends([e["sim_hit_rate"] for e in log if "sim_hit_rate" in e]),
            "log_reward": ends([e["reward"] for e in log if "reward" in e]),
            # The same simulator on greedy continuations of the first prompts, before and after.
            "greedy_sim_hit_rate": {"start": before, "end": after},
            "merge_max_logit_gap": gap,
            "log": log,
            "seconds": time.perf_counter() - started,
        }
        provenance.write_results(tmp / TRAINING_LOG, report, settings, device, kind=TuningLog)
    return report


def ends(values: list[float]) -> dict | None:
    """Mean of the first and of the last quarter of a per-step series (None if empty)."""
    if not values:
        return None
    q = max(1, len(values) // 4)
    return {"start": sum(values[:q]) / q, "end": sum(values[-q:]) / q}


def with_tag(ids: list[int], tag_ids: list[int]) -> list[int]:
    """A held-out sequence as the tagged variant was trained to read it: the tag after the
    document-boundary token."""
    return [ids[0], *tag_ids, *ids[1:]]


def measure(settings, name, model_source, tokenizer_source, sequences_path, out) -> dict:
    """One model in the harness: teacher-forced held-out text and the model's own greedy
    continuations of the same texts' starts."""
    from moecache.data import corpus
    from moecache.router_tuning import measure as harness
    from moecache.router_tuning import prompts

    if name not in MODELS:
        raise MoecacheError(f"model {name!r}: one of {', '.join(MODELS)}")
    tuning, device = settings["router_tuning"], settings["harness"]["device"]
    model, tok = setup(settings, model_source, tokenizer_source)
    sequences = corpus.read_sequences(sequences_path)[: tuning["measure_sequences"]]
    if len(sequences) < tuning["measure_sequences"]:
        raise MoecacheError(
            f"{sequences_path}: {len(sequences)} sequences, router_tuning.measure_sequences "
            f"needs {tuning['measure_sequences']}"
        )
    head = tuning["prompt_tokens"]
    if name == "tag":  # the serving cache's size; its tokens are scored too
        tag_ids = tok(prompts.tag(settings["harness"]["capacity"]) + " ", add_special_tokens=False)
        sequences = [with_tag(s, tag_ids["input_ids"]) for s in sequences]
        head += len(tag_ids["input_ids"])
    starts = [s[:head] for s in sequences[: tuning["generation_prompts"]]]
    fixed = harness.harness_counts(model, sequences, settings)
    own_text = harness.generate(
        model, starts, tuning["completion_tokens"], tok.pad_token_id, device
    )
    own = harness.harness_counts(model, own_text, settings, starts=[len(s) for s in starts])
    training = None
    if name != "base":
        training = read_dict(Path(model_source).parent / TRAINING_LOG, TuningLog)
        training = {key: training[key] for key in TRAINING_SUMMARY}
    report = {
        "model": name,
        "source": str(model_source),
        "nll_comparable": name != "tag",
        "teacher_forced": fixed,
        "own_generations": own,
        "training": training,
    }
    return provenance.write_results(out, report, settings, device, kind=TunedModel)


TRAINING_SUMMARY = (
    "steps",
    "log_sim_hit_rate",
    "log_reward",
    "greedy_sim_hit_rate",
    "merge_max_logit_gap",
)
