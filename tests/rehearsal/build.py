"""A stand-in for the hub on a machine with no network: a tiny OLMoE checkpoint saved as the
published ones are, and a local text file, for config/rehearsal.yaml.

The checkpoint has what `allenai/OLMoE-1B-7B-0125` has: transformers' `config.json` with
model_type olmoe, safetensors weights with one tensor per expert and projection
(`model.layers.L.mlp.experts.E.gate_proj.weight`, ...), and a tokenizer of its own with no
BOS token (documents start at the end-of-text token, as OLMoE's do). The text file is JSON
lines with a `text` field, read through `datasets`' `json` builder like a hub dataset.

    python tests/rehearsal/build.py rehearsal    # in the folder Snakemake runs in
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "rehearsal.yaml"
EOS, PAD = "<|endoftext|>", "<|padding|>"


def documents(count: int, min_chars: int) -> list[str]:
    """Python's own documentation topics, the ones long enough to keep."""
    from pydoc_data.topics import topics

    texts = [topics[name].strip() for name in sorted(topics)]
    return [text for text in texts if len(text) >= min_chars][:count]


def tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def checkpoint(arch: dict, tok, seed: int):
    """A randomly initialised OLMoE at the config's sizes, with OLMoE's load-balancing
    weight; the tokenizer has no BOS token, so neither has the model."""
    from transformers import OlmoeForCausalLM

    from moecache.model.checkpoint import embedded_config

    torch.manual_seed(seed)
    return OlmoeForCausalLM(embedded_config(arch, tok, router_aux_loss_coef=0.01)).eval()


def build(out: str | Path, config_path: Path = CONFIG) -> Path:
    """Write the checkpoint and the text file where `config_path` expects them, relative to
    `out`'s parent (the folder Snakemake runs in)."""
    from safetensors import safe_open

    config = yaml.safe_load(config_path.read_text())
    root = Path(out).parent
    model_dir = root / config["model"]["source"]
    data_file = root / config["corpus"]["hub"]["data_files"]
    heldout = config["corpus"]["heldout"]
    needed = max(heldout["shards"].values()) + heldout["sequences"]
    texts = documents(needed + 8, config["corpus"]["min_chars"])
    data_file.parent.mkdir(parents=True, exist_ok=True)
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = tokenizer(texts, vocab_size=512)
    model = checkpoint(config["model"]["architecture"], tok, config["seed"])
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    with safe_open(model_dir / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    # The hub's layout, which transformers converts to fused experts on load.
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in names, sorted(names)[:8]
    assert not any(name.endswith("experts.gate_up_proj") for name in names)
    return model_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/rehearsal/build.py FOLDER")
    print(f"rehearsal checkpoint: {build(sys.argv[1])}")
