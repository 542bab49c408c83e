"""The embedded model's tokenizer: byte-level BPE trained offline on the training text."""

from __future__ import annotations

from pathlib import Path

from moecache.atomic import atomic_dir
from moecache.errors import MoecacheError, first_line

DOCUMENT_BOUNDARY = "<|endoftext|>"


def train(texts: list[str], vocab_size: int, out_dir: str | Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[DOCUMENT_BOUNDARY],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=DOCUMENT_BOUNDARY,
        eos_token=DOCUMENT_BOUNDARY,
        pad_token=DOCUMENT_BOUNDARY,
    )
    with atomic_dir(out_dir) as tmp:
        fast.save_pretrained(tmp)


def load(source: str | Path):
    """A tokenizer from a local folder or a hub id (offline unless the config allows)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise MoecacheError(f"tokenizer {source}: cannot load ({first_line(error)})") from None


def document_ids(tok, text: str) -> list[int]:
    """A document as the model sees it: a boundary token, then the text."""
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    return [start, *tok(text, add_special_tokens=False)["input_ids"]]
