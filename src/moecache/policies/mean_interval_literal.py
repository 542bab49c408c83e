"""Mean interval, the paper's sentence read literally (appendix, learned eviction:
"evicting by predicted time to next use, estimated from each expert's mean interval between
requests"): predicted next use = last use + mean interval between the expert's requests,
and the resident predicted farthest is evicted.

It differs from `mean-interval` in one case the paper does not state: an expert requested
once has no interval yet. Read literally its mean interval is that of no gaps, taken as
zero, so its predicted next use is its last use: nearest, kept like any expert about to
return. `mean-interval` instead counts it as never returning (farthest, evicted first).
Bursts are where the two part: an expert seen once in a burst stays here and goes there.
"""

import numpy as np

from moecache.policies.mean_interval import MeanInterval


class MeanIntervalLiteral(MeanInterval):
    name = "mean-interval-literal"

    def priority(self, t, rows, probs):
        recency, uses = self.recency[rows], self.uses[rows]
        last = recency // self.top_k - 1  # the token of the last use
        gaps = np.maximum(uses - 1, 1)  # a single use: no gap, a mean interval of zero
        forecast = last + (last - self.first_use[rows]) / gaps
        # Farthest forecast first; ties to the least recently used, then the lowest id.
        return -forecast, recency
