"""Training prompts: the start of each training document, with its true continuation (the
SFT control's target) and, for the tagged variant, a `[CACHE_SIZE=c]` tag whose c is drawn
per prompt. The same prompts train every variant."""

from __future__ import annotations

import re

import numpy as np

from moecache.errors import MoecacheError

TAG = "[CACHE_SIZE={}]"
TAG_PATTERN = re.compile(r"\[CACHE_SIZE=(\d+)\]")


def tag(capacity: int) -> str:
    return TAG.format(capacity)


def tagged_size(prompt: str) -> int:
    """The c of a prompt's tag; a prompt without one is a bug in the caller."""
    found = TAG_PATTERN.search(prompt)
    if found is None:
        raise MoecacheError(f"prompt without a {TAG.format('c')} tag: {prompt[:40]!r}")
    return int(found.group(1))


def build(docs: list[dict], tok, tuning: dict, seed: int, tagged: bool) -> list[dict]:
    """One row per training document long enough for a prompt and a continuation:
    `prompt` (text, starting with the document-boundary token the model was trained to see
    first), `completion` (the document's next tokens, as text) and `cache_size` (the
    tag's c; 0 untagged)."""
    from moecache.data.tokenizer import document_ids

    need, cont = tuning["prompt_tokens"], tuning["completion_tokens"]
    rng = np.random.default_rng(seed)
    rows = []
    for doc in docs:
        ids = document_ids(tok, doc["text"])
        if len(ids) < need + cont:
            continue
        # Drawn for every prompt, tagged or not, so both variants see the same texts.
        size = int(rng.choice(tuning["cache_sizes"]))
        text = tok.decode(ids[1:need])
        head = tok.decode(ids[:1]) + (tag(size) + " " if tagged else "")
        rows.append(
            {
                "prompt": head + text,
                "completion": tok.decode(ids[need : need + cont]),
                "cache_size": size if tagged else 0,
            }
        )
        if len(rows) == tuning["prompts"]:
            return rows
    raise MoecacheError(
        f"router_tuning.prompts: {len(rows)} training documents have "
        f"{need + cont} tokens, {tuning['prompts']} needed"
    )
