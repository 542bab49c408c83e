"""The one interface every prefetcher implements (as policy.py is for cache policies).

After a restricted layer has computed token t, its block asks the arm's prefetcher which
experts to copy ahead of demand, and for which block and token: `want(block, t, hidden)`
returns a `Want` (or None). The target pool's eviction rule picks the victims; experts the
current token needs or still in flight are never evicted. Prefetching never changes
routing: it only changes which copies are made when.

The blocks of an arm are linked in layer order (`block.following`), the last to the first,
whose next use is the next token. A block knows its `layer`, the recorded demand of its
layer for this sequence (`block.future`, per token, for prefetchers that read the trace),
its model's own MoE module (`block.own`) and the family's adapter (`block.adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Want:
    block: object  # the block whose pool takes the copies
    deadline: int  # the last token the copies are for (a prefetch unused by then is wasted)
    experts: list[int]  # in the order to copy them, the likeliest first


class Prefetcher:
    """Base of all prefetchers. Subclasses set `name` and take their parameters as keywords."""

    name: str = ""
    needs_trace: bool = False  # True: reads the recorded demand (the arm reads a trace)

    def __init__(self) -> None:
        """No parameters (a subclass that takes some names them as keywords)."""

    def want(self, block, t: int, hidden) -> Want | None:
        """What to copy once `block` has computed token t; `hidden` [1, H] is the layer's
        output hidden state for that token (its input plus the routed experts' output)."""
        raise NotImplementedError


def next_layer(block, t: int):
    """(the next restricted layer's block, the token it computes next): the same token,
    or the next one when `block` is the last layer."""
    following = block.following
    return following, (t + 1 if following.layer <= block.layer else t)


def recorded(block, t: int) -> list[int] | None:
    """`block`'s layer's recorded demand at token t (None past the sequence's end)."""
    return list(block.future[t]) if t < len(block.future) else None
