"""The least cost over two tiers by exhaustive search, for tiny streams: tier_bound's
independent check (tests/test_tiers.py).

The state before token t is (D, H): the experts on the device and in the host, as bitmasks.
Token t requests S. A demand-driven step (tier_bound.py's class) picks D' within D | S of at
most C experts (holding S without bypass); the copies are F = D' - D, the computes
K = S - D'; the host must hold F | K and takes nothing else in: H' holds F | K, lies within
H | F | K and has at most H experts. The step costs f |F| + h |K| + r |H' - H|. Every
(D', H') is tried from every reachable state: exponential, meant for N <= 6.
"""

from __future__ import annotations

from itertools import combinations

from moecache.errors import MoecacheError
from moecache.replay.tier_bound import Prices

MAX_EXPERTS = 6


def subsets(mask: int, must: int, most: int):
    """Every subset of `mask` that holds `must` and has at most `most` members."""
    free = [1 << b for b in range(mask.bit_length()) if mask >> b & 1 and not must >> b & 1]
    room = most - must.bit_count()
    for size in range(max(room, -1) + 1):
        for picked in combinations(free, size):
            yield must | sum(picked)


def least_cost(
    tokens: list[list[int]],
    num_experts: int,
    capacity: int,
    host: int | None,
    bypass: bool,
    prices: Prices,
) -> float:
    """The least cost of serving `tokens` (each a list of distinct expert ids)."""
    if num_experts > MAX_EXPERTS:
        raise MoecacheError(f"tier search: at most {MAX_EXPERTS} experts, got {num_experts}")
    everything = (1 << num_experts) - 1
    states = {(0, everything if host is None else 0): 0.0}
    for request in tokens:
        want = sum(1 << e for e in request)
        after: dict[tuple[int, int], float] = {}
        for (device, held), cost in states.items():
            for kept in subsets(device | want, 0 if bypass else want, capacity):
                copied, computed = kept & ~device, want & ~kept
                need = copied | computed
                step = prices.copy * copied.bit_count() + prices.compute * computed.bit_count()
                holds = [held] if host is None else subsets(held | need, need, host)
                for hold in holds:
                    total = cost + step + prices.read * (hold & ~held).bit_count()
                    if total < after.get((kept, hold), float("inf")):
                        after[(kept, hold)] = total
        states = after
    return min(states.values())
