"""The text the study runs on: a training part and disjoint held-out shards.

The embedded corpus is built from text that ships with Python itself (the documentation
topics of `pydoc_data` and the docstrings of the standard library's sources, read with
`ast` so no module is imported), so it exists on every machine without a download.
A hub corpus reads a `datasets` dataset instead (a hub id or a local path).
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moecache.atomic import atomic_file
from moecache.errors import MoecacheError

SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def python_docs() -> Iterator[dict]:
    """Every documentation topic and stdlib docstring, in a fixed order."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield {"id": f"topic:{name}", "text": topics[name].strip()}
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS & set(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node)
                if text:
                    name = getattr(node, "name", "")
                    yield {
                        "id": f"doc:{rel.as_posix()}:{name}:{node.lineno if name else 0}",
                        "text": text,
                    }


def hub_docs(hub: dict, min_chars: int, needed: int) -> list[dict]:
    """The first `needed` documents of at least `min_chars` from a datasets dataset."""
    import datasets

    try:
        stream = datasets.load_dataset(
            hub["path"],
            hub.get("name"),
            split=hub["split"],
            streaming=True,
            data_files=hub.get("data_files"),
        )
    except Exception as error:  # datasets raises many types; the message is what helps
        raise MoecacheError(f"corpus.hub: cannot load {hub['path']}: {error}") from None
    docs = []
    for i, row in enumerate(stream):
        if hub["text_field"] not in row:
            raise MoecacheError(f"corpus.hub.text_field: no field {hub['text_field']!r}")
        text = row[hub["text_field"]].strip()
        if len(text) >= min_chars:
            docs.append({"id": f"{hub['path']}:{hub['split']}:{i}", "text": text})
            if len(docs) == needed:
                return docs
    raise MoecacheError(
        f"corpus.heldout.shards: {hub['path']} has {len(docs)} documents of at least "
        f"{min_chars} characters, the shards need {needed}"
    )


def split(docs: list[dict], heldout: dict, seed: int | None) -> dict[str, list[dict]]:
    """Held-out shards at their offsets of the (seeded, shuffled) order; the rest trains.

    With seed None the order is the source's own (a hub split is already shuffled).
    """
    order = np.arange(len(docs))
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(docs))
    n = heldout["sequences"]
    end = max(heldout["shards"].values()) + n
    if end > len(docs):
        raise MoecacheError(
            f"corpus.heldout.shards: the corpus has {len(docs)} documents, the shards need {end}"
        )
    parts, used = {}, set()
    for shard, offset in heldout["shards"].items():
        picked = order[offset : offset + n]
        used.update(picked.tolist())
        parts[f"shard-{shard}"] = [docs[i] for i in picked]
    parts["train"] = [docs[i] for i in order if i not in used]
    return parts


def build(corpus: dict, seed: int) -> dict[str, list[dict]]:
    heldout = corpus["heldout"]
    if corpus["source"] == "hub":
        # A pretrained model is not trained here: the training part is only read for the
        # learned eviction rules' trace, so as many documents more are read as it needs.
        traced = corpus.get("trace_sequences", 0)
        needed = max(heldout["shards"].values()) + heldout["sequences"] + traced
        parts = split(hub_docs(corpus["hub"], corpus["min_chars"], needed), heldout, None)
        if not traced:
            del parts["train"]
        return parts
    docs = [d for d in python_docs() if len(d["text"]) >= corpus["min_chars"]]
    parts = split(docs, heldout, seed)
    if "max_train_documents" in corpus:
        parts["train"] = parts["train"][: corpus["max_train_documents"]]
    return parts


def write(parts: dict[str, list[dict]], out_dir: str | Path) -> None:
    import datasets

    for name, docs in parts.items():
        with atomic_file(Path(out_dir) / f"{name}.parquet") as tmp:
            datasets.Dataset.from_list(docs).to_parquet(str(tmp))


def read(path: str | Path) -> list[dict]:
    import pandas as pd

    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no such corpus file")
    return pd.read_parquet(path).to_dict("records")


def sequences(tok, docs: list[dict], max_tokens: int) -> list[dict]:
    """Held-out documents as token sequences cut to at most `max_tokens`."""
    from moecache.data.tokenizer import document_ids

    rows = []
    for i, doc in enumerate(docs):
        ids = document_ids(tok, doc["text"])[:max_tokens]
        rows.append({"sequence": i, "id": doc["id"], "tokens": len(ids), "input_ids": ids})
    return rows


def write_sequences(rows: list[dict], path: str | Path) -> None:
    import datasets

    with atomic_file(path) as tmp:
        datasets.Dataset.from_list(rows).to_parquet(str(tmp))


def read_sequences(path: str | Path) -> list[list[int]]:
    return [[int(i) for i in row["input_ids"]] for row in read(path)]
