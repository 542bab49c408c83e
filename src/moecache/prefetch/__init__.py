"""Prefetchers: one small module each, all behind moecache.prefetch.base.Prefetcher.

Add one by writing a module with a Prefetcher subclass and naming it in PREFETCHERS.
"""

from __future__ import annotations

import inspect

from moecache.errors import MoecacheError
from moecache.prefetch.base import Prefetcher, Want
from moecache.prefetch.lookahead import Lookahead
from moecache.prefetch.none import NoPrefetch
from moecache.prefetch.oracle import Oracle
from moecache.prefetch.pregate import PreGate

PREFETCHERS: dict[str, type[Prefetcher]] = {
    cls.name: cls for cls in (NoPrefetch, PreGate, Oracle, Lookahead)
}

__all__ = ["PREFETCHERS", "Prefetcher", "Want", "make"]


def make(name: str, params: dict | None = None) -> Prefetcher:
    """The prefetcher `name` with its keyword parameters; one line on a bad name or key."""
    if name not in PREFETCHERS:
        raise MoecacheError(f"prefetch {name!r}: not one of {', '.join(PREFETCHERS)}")
    cls, params = PREFETCHERS[name], params or {}
    known = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise MoecacheError(f"prefetch {name}: unknown parameter(s) {', '.join(unknown)}")
    return cls(**params)
