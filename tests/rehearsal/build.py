"""A stand-in for the hub on a machine with no network: a tiny checkpoint of the config's
`model.family` saved as the published ones are, and a local text file, for
config/rehearsal.yaml (OLMoE) and config/rehearsal-qwen3.yaml (Qwen3-MoE).

The checkpoint has what `allenai/OLMoE-1B-7B-0125` or `Qwen/Qwen3-30B-A3B` has:
transformers' `config.json` with the family's model_type, safetensors weights in the hub's
layout of that family (its adapter's `hub_expert`; OLMoE, Qwen and DeepSeek: one tensor
per expert and projection, `model.layers.L.mlp.experts.E.gate_proj.weight`, ...), and a
tokenizer of its own with no BOS token (documents start at the end-of-text token, as
OLMoE's do). The text file is JSON lines with a `text` field, read through `datasets`'
`json` builder like a hub dataset.

    python tests/rehearsal/build.py rehearsal [CONFIG]   # in the folder Snakemake runs in
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


def checkpoint(arch: dict, tok, seed: int, family: str = "olmoe"):
    """A randomly initialised model of `family` at the config's sizes; the tokenizer has no
    BOS token, so neither has the model. OLMoE's is the embedded model's architecture with
    OLMoE's load-balancing weight (config/rehearsal.yaml's numbers rest on it); any other
    family's is moecache.model.tiny's."""
    if family != "olmoe":
        from moecache.model import tiny

        return tiny.model(family, arch, len(tok), seed, tok)
    from transformers import OlmoeForCausalLM

    from moecache.model.checkpoint import embedded_config

    torch.manual_seed(seed)
    return OlmoeForCausalLM(embedded_config(arch, tok, router_aux_loss_coef=0.01)).eval()


def check_layout(model, names: set[str]) -> None:
    """The saved weights are in the hub's layout of the model's family: every routed
    expert of every MoE layer stored where the family's hub checkpoints store it, and no
    experts in a dense layer."""
    from moecache.model import registry

    adapter = registry.of(model)
    sizes = adapter.sizes(model.config)
    layout = adapter.hub_expert  # where the family's hub checkpoints keep one expert's weight
    for layer in range(sizes.num_hidden_layers):
        wanted = {layout.format(layer=layer, expert=e) for e in range(sizes.num_experts)}
        if layer in sizes.moe_layers:
            assert wanted <= names, sorted(wanted - names)[:4]
        else:
            assert not any(f"layers.{layer}.mlp.experts" in name for name in names), layer
    if "{expert}" in layout:
        assert not any(name.endswith("experts.gate_up_proj") for name in names)


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
    family = config["model"].get("family", "olmoe")
    model = checkpoint(config["model"]["architecture"], tok, config["seed"], family)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    with safe_open(model_dir / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    check_layout(model, names)
    return model_dir


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python tests/rehearsal/build.py FOLDER [CONFIG]")
    config_path = Path(sys.argv[2]) if len(sys.argv) == 3 else CONFIG
    if not config_path.is_file():
        print(f"build.py: error: config file {config_path}: not found", file=sys.stderr)
        sys.exit(2)
    print(f"rehearsal checkpoint: {build(sys.argv[1], config_path)}")
