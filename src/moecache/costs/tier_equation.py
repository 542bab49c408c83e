"""Equation (1) with a term per tier (docs/tiers.md, "Measured in the harness"): a token's
cost over a device pool, a host cache and a disk, each event at its price, beside
equation (1) for one tier (equation.py); the tiered harness's record (harness/tier_record.py)
checks its decoding against it."""

from __future__ import annotations

from moecache.errors import MoecacheError

TIER_WITHIN = 0.10  # the tiered harness's check: |predicted / measured - 1| <= TIER_WITHIN
TIER_EQUATION = (
    "c + bookkeeping + (copies * host_to_device_ms + reads * disk_to_host_ms"
    " + computes * (host_compute_ms - device_compute_ms)) / tokens"
)


def tier_ms_per_token(
    c_ms: float, tokens: int, counts: dict, prices: dict, bookkeeping_ms: float = 0.0
) -> float:
    """Equation (1) over a device pool, a host cache and a disk: c, the ms per token with
    every requested expert computed on the device and nothing moved (the harness: its
    all-resident reference, its device computes priced as a pool's), plus per event
    its price: a copy into the device, a disk read into the host, and for a miss computed
    on the host the host matvec in place of the device's (`device_compute_ms`, 0 where
    unpriced). `counts`: copies, reads, computes over all streams; `tokens`: tokens decoded,
    every layer's events counting against one token, first tokens included.
    `bookkeeping_ms`: per token, what deciding the moves costs beyond c's own deciding (the
    harness's Python rules, timed in its runs; a runtime's own rule has its own)."""
    if tokens <= 0:
        raise MoecacheError("the tier equation needs at least one token decoded")
    compute = prices["host_compute_ms"] - prices.get("device_compute_ms", 0.0)
    events = (
        counts["copies"] * prices["host_to_device_ms"]
        + counts["reads"] * prices["disk_to_host_ms"]
        + counts["computes"] * compute
    )
    return c_ms + bookkeeping_ms + events / tokens
