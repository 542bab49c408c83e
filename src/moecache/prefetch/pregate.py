"""Next-layer pre-gating, as mixtral-offloading guesses: layer l+1's own router applied to
layer l's output hidden state, its top-k fetched for layer l+1 at the same token.

The block sees its normalised input and the routed experts' output, not the residual stream,
so the hidden state here is their sum; the guess is measured (prefetch accuracy), never
trusted. After the last restricted layer nothing is guessed: the next token's hidden state
does not exist yet.
"""

from moecache.prefetch.base import Prefetcher, Want, next_layer


class PreGate(Prefetcher):
    name = "pregate"

    def want(self, block, t, hidden):
        target, token = next_layer(block, t)
        if token != t:
            return None
        _, _, index = target.adapter.route(target.own, hidden)
        return Want(target, token, index[0].tolist())
