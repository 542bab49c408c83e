"""The oracle of the next layer's demand: what layer l+1 requests at the token, read from
the recorded trace (the same run's demand, since eviction never changes routing). No
next-layer prefetcher can do better; after the last layer it fetches the first layer's
demand at the next token."""

from moecache.prefetch.base import Prefetcher, Want, next_layer, recorded


class Oracle(Prefetcher):
    name = "oracle"
    needs_trace = True

    def want(self, block, t, hidden):
        target, token = next_layer(block, t)
        demand = recorded(target, token)
        return None if demand is None else Want(target, token, demand)
