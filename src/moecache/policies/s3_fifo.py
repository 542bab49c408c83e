"""S3-FIFO (Yang et al., SOSP 2023), as libCacheSim's S3FIFO: a small FIFO S (int(C * 0.1)
slots), a main FIFO M (the rest) with a 2-bit CLOCK counter, and a ghost FIFO G of ids
(int(C * 0.9)). A hit adds 1 to an expert's counter. A miss remembered in G enters M,
any other miss S (M, while nothing has been evicted yet and S is full). To evict: from M
when M is above its share or S is empty, else from S. From S: the oldest goes to M
(counter 0) if it was hit at least `threshold` (2) times, else it is evicted into G. From
M: the oldest is reinserted at the head with min(count, 3) - 1 if its count is above 0,
else evicted. Repeat until one expert is evicted.

libCacheSim admits no new object while S has fewer than 2 slots (C < 20); here every
miss is admitted. Per token: S and M yield their oldest experts the token does not need;
the token's own stay where they are, counts kept.
"""

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels

S, M, G = 1, 2, 3  # list ids: small, main, ghost (ids of experts evicted from S)


# State: the lists' arrays (kernels.lists), where [streams, N] S, M, G or 0, stamp [streams, N]
#   FIFO order within a list; then
#   count: [streams, N] hits (M: the CLOCK counter)
#   seen: [streams] the current miss was found in G
#   evicted: [streams] some expert has been evicted
#   small: S's share
#   ghost: G's length
#   main: M's share
#   threshold: hits in S that earn M
State = kernels.state_type(
    __name__, "count", "seen", "evicted", "small", "ghost", "main", "threshold"
)


@njit(inline="always")
def on_hit(s, row, e):
    s.count[row, e] += 1


@njit(inline="always")
def on_miss(s, row, e):
    kernels.recall(s, row, e, G)


@njit(inline="always")
def from_main(s, row, busy):
    """M's CLOCK: the kernels.oldest at count 0 goes; older ones go round with one less."""
    while True:
        x = kernels.oldest(s, row, M, busy)
        if s.count[row, x] == 0:
            return x
        s.count[row, x] = min(s.count[row, x], 3) - 1
        kernels.put(s, row, x, M)


@njit(inline="always")
def victim(s, row, e, busy):
    s.evicted[row] = True
    while True:  # one libCacheSim eviction round: from M, or from S until one goes
        x = kernels.oldest(s, row, S, busy)
        main = kernels.oldest(s, row, M, busy) >= 0
        if main and (kernels.size(s, row, M) > s.main or x < 0):
            return from_main(s, row, busy)
        while x >= 0:
            if s.count[row, x] < s.threshold:
                return x
            kernels.put(s, row, x, M)
            s.count[row, x] = 0
            x = kernels.oldest(s, row, S, busy)


@njit(inline="always")
def on_evict(s, row, e):
    kernels.evict_remembering(s, row, e, S, G, s.ghost)


@njit(inline="always")
def on_insert(s, row, e):
    into_main = s.seen[row] or (not s.evicted[row] and kernels.size(s, row, S) >= s.small)
    kernels.put(s, row, e, M if into_main else S)
    s.count[row, e] = 0


kernels.register(State, on_hit, on_miss, victim, on_evict, on_insert)


class S3FIFO(kernels.CompiledEventPolicy):
    name = "s3-fifo"
    libcachesim = "S3FIFO"  # the same algorithm there (tests/test_zoo.py)

    def __init__(
        self,
        capacity,
        num_experts,
        top_k,
        small: float = 0.1,
        ghost: float = 0.9,
        threshold: int = 2,
    ):
        super().__init__(capacity, num_experts, top_k)
        if not (0 <= small < 1 and ghost >= 0 and threshold >= 1):
            raise MoecacheError(
                f"policy {self.name}: need 0 <= small < 1, ghost >= 0, threshold >= 1"
            )
        self.small, self.ghost = int(capacity * small), int(capacity * ghost)
        self.main, self.threshold = capacity - self.small, threshold

    def new_state(self, streams):
        flags = {key: np.zeros(streams, dtype=np.bool_) for key in ("seen", "evicted")}
        return State(
            **kernels.lists(streams, self.num_experts),
            count=np.zeros((streams, self.num_experts), dtype=np.int64),
            **flags,
            small=self.small,
            ghost=self.ghost,
            main=self.main,
            threshold=self.threshold,
        )
