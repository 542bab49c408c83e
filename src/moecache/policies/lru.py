"""Least recently used: evict the resident whose last request is oldest.

Compiled for replay (kernels.py) through the same kernel table as the zoo: a resident's
key is its recency, (1 + t) * k + its position in the request of t, its last token,
learnt once the token is in (on_token), and FAR once evicted; the victim is the lowest
key the token does not need (kernels.lowest). Residents' keys are distinct.
"""

from collections import namedtuple

import numpy as np
from numba import njit

from moecache.policies import kernels
from moecache.policies.eviction import EvictionPolicy

# State (compiled replay): key [streams, N] each resident's recency (FAR: not resident),
# tokens [streams] the tokens seen.
State = namedtuple("State", ("key", "tokens"), module=__name__)


@njit(inline="always")
def on_token(s, row, request):
    k, t = len(request), s.tokens[row]
    for j in range(k):
        s.key[row, request[j]] = (1 + t) * k + j
    s.tokens[row] = t + 1


kernels.register_keyed(State, on_token)


class LRU(EvictionPolicy):
    name = "lru"

    def priority(self, t, rows, probs):
        return self.least_recent(rows)

    def compiled_state(self, requests, lengths):
        if type(self) is not LRU:  # a subclass may rank otherwise
            return None
        streams = len(requests)
        key = np.full((streams, self.num_experts), kernels.FAR, dtype=np.int64)
        return State(key, np.zeros(streams, dtype=np.int64))
