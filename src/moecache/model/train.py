"""Train the embedded tiny OLMoE on the training text, plain PyTorch in the style of nanoGPT."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm import tqdm

from moecache.atomic import atomic_dir
from moecache.data import tokenizer as tokenizers
from moecache.errors import MoecacheError
from moecache.model import checkpoint
from moecache.records.io import write_record
from moecache.records.training import ModelTraining


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """All training documents, each opened by the boundary token, as one long stream."""
    ids = [i for text in texts for i in tokenizers.document_ids(tok, text)]
    return torch.tensor(ids, dtype=torch.long)


def train(settings: dict, tokenizer_dir: str | Path, texts: list[str], out_dir: str | Path):
    """Train from `settings` (sections seed, model, training); save with save_pretrained.
    Bit for bit reproducible for a given seed and thread count."""
    training = settings["training"]
    torch.manual_seed(settings["seed"])
    torch.set_num_threads(training["threads"])
    # With more than one thread, accumulating ops in the MoE backward sum gradients in
    # whatever order the threads finish, and the weights drift apart within a few steps.
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return fit(settings, tokenizer_dir, texts, out_dir)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def fit(settings: dict, tokenizer_dir, texts: list[str], out_dir) -> dict:
    from transformers import OlmoeForCausalLM, get_cosine_schedule_with_warmup

    training, arch = settings["training"], settings["model"]["architecture"]
    tok = tokenizers.load(tokenizer_dir)
    stream = token_stream(tok, texts)
    seq_len, batch = training["seq_len"], training["batch_size"]
    if len(stream) <= seq_len + 1:
        raise MoecacheError(
            f"training.seq_len: {seq_len} needs more than the {len(stream)} training tokens"
        )
    config = checkpoint.embedded_config(arch, tok, training["router_aux_loss_coef"])
    model = OlmoeForCausalLM(config).train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=training["lr"],
        betas=(0.9, 0.95),
        weight_decay=training["weight_decay"],
    )
    schedule = get_cosine_schedule_with_warmup(
        optimizer, training["warmup_steps"], training["steps"]
    )
    batches = torch.Generator().manual_seed(settings["seed"])
    log = []
    for step in tqdm(range(training["steps"]), desc="train", unit="step"):
        starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=batches)
        x = torch.stack([stream[s : s + seq_len] for s in starts.tolist()])
        out = model(input_ids=x, labels=x, output_router_logits=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        lm_loss = out.loss.item() - config.router_aux_loss_coef * out.aux_loss.item()
        if not math.isfinite(lm_loss):
            raise MoecacheError(f"training.lr: loss became {lm_loss} at step {step}")
        log.append({"step": step, "lm_loss": lm_loss, "aux_loss": out.aux_loss.item()})
    summary = {
        "training_tokens": len(stream),
        "tokens_seen": training["steps"] * batch * seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "log": log,
    }
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        write_record(tmp / "training.json", ModelTraining(**summary))
    return summary
