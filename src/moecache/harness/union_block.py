"""The pooled MoE block of batched decoding: one token of each running sequence per call,
or, at prefill, the prompt's P tokens of each (the union then spans every row and position).

Its input rows are the batch's running sequences, in slot order. The layer requests the
union of their routers' experts: sequence after sequence, each in its router's order,
repeats dropped, exactly as the batched replay builds it (records/batch.py).

Lossless rules (eviction rules, the all-resident pool): a union wider than the pool's C
slots is served in the replay's rounds (resident experts first, then the rest, each in
ascending id, C at a time); each round is one request the rule plans, and the rows compute
with that round's experts before the next round may evict them, so the pool never holds
more than C. Routing is the model's own.

Restricting policies (scheduled: dwell, static): one allowed set for the whole batch. The
policy plans once on the step's union (its refresh may change the set), and then every
row's router chooses among the resident experts with the family's own restricted routing
(adapter.restrict, as PooledMoeBlock.restrict), so no row needs a round. harness/batched.py
refuses the policies this block cannot run.
"""

from __future__ import annotations

import numpy as np
import torch

from moecache.errors import MoecacheError
from moecache.harness.pooled_block import PooledMoeBlock
from moecache.model.adapter import allowed_mask
from moecache.model.kernel import per_expert_forward
from moecache.policies import EvictionPolicy
from moecache.records import batch

UNION_FIELDS = ("token", "requested", "used", "copied", "rounds", "refreshed")


class UnionBlock(PooledMoeBlock):
    def reset(self, future=None) -> None:
        """A new batch: empty pool, fresh rule; `future` [T, W]: the batch's union demand
        (records.batch.future's rows), for rules that read ahead."""
        super().reset(future)
        self.future = future

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows, length, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden)  # row after row, each position after position
        logits, top_weights, top_index = self.adapter.route(self.own, x)
        requests = top_index.tolist()  # the block's one host sync (restricted: two)
        union = list(dict.fromkeys(e for request in requests for e in request))
        if self.policy.restricts:
            out = self.restricted(x, union, logits)
        else:
            out = self.lossless(x, union, requests, top_weights)
        self.t += 1
        shared = self.adapter.shared(self.own, x)
        if shared is not None:
            out = out + shared
        return self.adapter.output(out.reshape(rows, length, hidden), top_weights)

    def lossless(self, x, union: list[int], requests, top_weights) -> torch.Tensor:
        """Every row with its router's own experts, the union served in rounds."""
        self.check_future(union)
        out = torch.zeros_like(x)
        parts = batch.rounds(np.array(union), self.resident_mask(), self.pool.capacity)
        copied = 0
        for part in parts:
            copied += self.serve(part.tolist())
            out += self.compute(x, requests, top_weights, set(part.tolist()))
        self.trace.append((self.t, union, union, copied, len(parts), False))
        return out

    def restricted(self, x, union: list[int], logits) -> torch.Tensor:
        """One change on the union, then every row routed among the resident experts."""
        change = self.policy.change(self.t, union, None, self.pool.resident)
        if change.admit or change.evict:
            self.pool.apply(change)
        resident = self.pool.resident
        allowed = allowed_mask(self.num_experts, resident, logits.device)
        weights, index = self.adapter.restrict(self.own, logits, allowed)
        held = min(self.top_k, len(resident))
        chosen = index[:, :held].tolist()
        slots = [[self.pool.slot_of[e] for e in row] for row in chosen]
        out = self.kernel(x, slots, weights[:, :held].to(logits.dtype))
        used = list(dict.fromkeys(e for row in chosen for e in row))
        self.trace.append((self.t, union, used, len(change.admit), 1, change.refresh))
        return out

    def resident_mask(self) -> np.ndarray:
        mask = np.zeros(self.num_experts, dtype=bool)
        mask[list(self.pool.resident)] = True
        return mask

    def serve(self, part: list[int]) -> int:
        """Make one round resident, as the rule plans it; its copies. An eviction rule's
        own change serves one request (farthest-future's check that a request is a whole
        recorded token is check_future's, on the union, since a round is a part of one)."""
        if isinstance(self.policy, EvictionPolicy):
            change = EvictionPolicy.change(self.policy, self.t, part, None, self.pool.resident)
        else:  # the all-resident pool
            change = self.policy.change(self.t, part, None, self.pool.resident)
        if change.admit or change.evict:
            self.pool.apply(change)
        return len(change.admit)

    def check_future(self, union: list[int]) -> None:
        if self.future is None:
            return
        t = self.t
        if t >= len(self.future) or set(self.future[t].tolist()) != set(union):
            raise MoecacheError(
                f"policy {self.policy.name}: the recorded union demand does not match this "
                f"batch at step {t}"
            )

    def compute(self, x, requests, top_weights, part: set[int]) -> torch.Tensor:
        """The routed output of the rows over the experts of `part` (resident now): a row's
        experts outside it weigh 0 here, on a resident slot, and count in their own round."""
        slot_of = self.pool.slot_of
        some = slot_of[next(iter(part))]
        inside = [[e in part for e in request] for request in requests]
        slots = [
            [slot_of[e] if keep else some for e, keep in zip(request, row, strict=True)]
            for request, row in zip(requests, inside, strict=True)
        ]
        if all(map(all, inside)):
            return self.kernel(x, slots, top_weights)
        active = [i for i, row in enumerate(inside) if any(row)]
        mask = torch.tensor([inside[i] for i in active], device=x.device)
        out = torch.zeros_like(x)
        weights = top_weights[active] * mask.to(top_weights.dtype)
        out[active] = self.kernel(x[active], [slots[i] for i in active], weights)
        return out

    def kernel(self, x, slots: list[list[int]], weights) -> torch.Tensor:
        if self.send.host_ids:  # the per-expert kernel reads the slot ids on the host
            return per_expert_forward(self.pool.kernel, x, slots, weights)
        return self.pool.kernel(x, torch.tensor(slots, device=x.device), weights)

    def steps(self) -> list[dict]:
        """Per step: the union requested, the union used (the requested one, but for a
        restricting policy), the experts copied in, the rounds it took, whether a
        restricting policy refreshed its set."""
        return [dict(zip(UNION_FIELDS, step, strict=True)) for step in self.trace]
