"""The data stage's commands: the corpus, the tokenizer, the held-out sequences."""

from __future__ import annotations

from pathlib import Path

from moecache.cli.command import add, load_settings, with_settings


def cmd_corpus(args):
    from moecache.data import corpus

    settings = load_settings(args, ("corpus",))
    corpus.write(corpus.build(settings["corpus"], settings["seed"]), args.out_dir)


def cmd_tokenizer(args):
    from moecache.data import corpus, tokenizer

    settings = load_settings(args, ("tokenizer",))
    texts = [doc["text"] for doc in corpus.read(args.train)]
    tokenizer.train(texts, settings["tokenizer"]["vocab_size"], args.out)


def cmd_heldout(args):
    from moecache.data import corpus, tokenizer

    settings = load_settings(args, ("corpus",))
    tok = tokenizer.load(args.tokenizer)
    max_tokens = settings["corpus"]["heldout"]["max_tokens"]
    rows = corpus.sequences(tok, corpus.read(args.text), max_tokens)
    corpus.write_sequences(rows, args.out)


def register(sub) -> None:
    p = with_settings(add(sub, "corpus", cmd_corpus, "build the training text and held-out shards"))
    p.add_argument("--out-dir", required=True, type=Path)

    p = with_settings(add(sub, "tokenizer", cmd_tokenizer, "train the byte-level BPE tokenizer"))
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(add(sub, "heldout", cmd_heldout, "tokenize one held-out shard"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
