"""Continuous batching in the harness, as records.batch.places defines it: B slots; a
sequence that ends frees its slot and the next sequence (in order) takes it at once, the
earliest free slot first, the lower slot on ties. One pool and one policy stream per layer
for the whole shard (reset once); the rows of each step are the running sequences in slot
order, so each layer's union is built slot after slot, as records.batch.union builds it.

The KV cache: rows of different ages share one transformers DynamicCache (RaggedCache). A
joining row gets zero keys and values for the positions cached before it joined, hidden by
the attention mask ([rows, past + 1], 0 on those positions), and its own position ids from
0 (OLMoE's model builds the causal mask from the cache's length and this 2-D mask, and its
rotary embedding from the position ids, row by row); a leaving row is dropped. Leading
columns every row masks are trimmed, so the cache holds no more than the oldest running
sequence's tokens.

The stream's first step fills the empty pools and is not timed; its copies are kept
apart as a static batch's first step's are (harness/batched.py). Each sequence's
`timed_tokens` is its tokens after its first, the replay's count of sequence-tokens.
"""

from __future__ import annotations

import torch

from moecache.harness import batched, decode
from moecache.harness.timing import Stopwatch
from moecache.records import batch as geometry


def stream(model, sequences, device, arm: decode.Arm, shape: tuple[int, int], futures):
    """Rows per sequence, the stream's one row (batch 0), the union trace; `shape`: (B, 0)."""
    size, _ = shape
    lengths = [len(ids) for ids in sequences]
    placed = [(slot, at) for _, slot, at in geometry.places(lengths, size, "continuous")]
    members = list(range(len(sequences)))
    future = None
    if futures is not None:
        experts = batched.experts_of(arm)
        future = batched.union_futures(futures, members, placed, shape, experts)
    row, rows, steps = decode_stream(model, arm, sequences, placed, device, future)
    seq_rows = [
        {"sequence": i, "batch": 0, "slot": slot, **r}
        for i, ((slot, _), r) in enumerate(zip(placed, rows, strict=True))
    ]
    return seq_rows, [{"batch": 0, "members": members, **row}], [{"batch": 0, **s} for s in steps]


def running_at(t: int, placed: list[tuple[int, int]], lengths: list[int]) -> list[int]:
    """The sequences running at step t, in slot order; `placed`: each one's (slot, first step)."""
    now = [i for i, (_, at) in enumerate(placed) if at <= t < at + lengths[i]]
    return sorted(now, key=lambda i: placed[i][0])


@torch.inference_mode()
def decode_stream(model, arm: decode.Arm, members: list, placed: list, device, future=None):
    """The continuous stream: (its row, one row per member, its steps per layer)."""
    state = batched.start(arm, future, members)
    lengths = [len(ids) for ids in members]
    kv = RaggedCache(model.config)
    watch = Stopwatch(device)
    for t in range(max(at + n for (_, at), n in zip(placed, lengths, strict=True))):
        running = running_at(t, placed, lengths)
        kv.regroup(running)
        positions = [t - placed[i][1] for i in running]
        inputs = {
            "input_ids": torch.tensor(
                [[members[i][p]] for i, p in zip(running, positions, strict=True)], device=device
            ),
            "position_ids": torch.tensor([[p] for p in positions], device=device),
            "attention_mask": kv.mask(device),
            "cache": kv.cache,
        }
        logits, seconds = batched.timed_forward(model, arm, inputs, watch)
        batched.score(state, logits, members, list(zip(running, positions, strict=True)))
        batched.stepped(state, arm, t == 0, seconds, running)
    return (
        batched.batch_row(arm, members, state),
        batched.member_rows(members, state),
        batched.steps_of(arm),
    )


class RaggedCache:
    """One DynamicCache whose rows joined at different steps: row r's own keys and values
    are its columns from start[r] on; the columns before are zeros its mask hides."""

    def __init__(self, config):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)
        self.members: list[int] = []  # the sequence of each row
        self.start: list[int] = []  # the column of each row's first token

    def regroup(self, members: list[int]) -> None:
        """The rows become `members`, in that order: a row whose sequence left is dropped,
        a new sequence's row gets zero keys and values for every cached column. Then the
        leading columns every row masks are trimmed."""
        width = self.cache.get_seq_length()
        joined = [m for m in members if m not in self.members]
        if width and members != self.members:
            for layer in self.cache.layers:
                layer.keys = with_zero_rows(layer.keys, len(joined))
                layer.values = with_zero_rows(layer.values, len(joined))
            rows = self.members + joined
            device = self.cache.layers[0].keys.device
            self.cache.batch_select_indices(
                torch.tensor([rows.index(m) for m in members], device=device)
            )
        begun = dict(zip(self.members, self.start, strict=True))
        self.members, self.start = list(members), [begun.get(m, width) for m in members]
        self.trim(min(self.start))

    def trim(self, columns: int) -> None:
        """Drop the first `columns` columns (every row masks them)."""
        if not columns:
            return
        for layer in self.cache.layers:
            layer.keys = layer.keys[..., columns:, :]
            layer.values = layer.values[..., columns:, :]
        self.start = [s - columns for s in self.start]

    def mask(self, device) -> torch.Tensor:
        """[rows, past + 1]: 1 on each row's own positions and the one it adds now."""
        columns = torch.arange(self.cache.get_seq_length() + 1, device=device)
        return (columns[None] >= torch.tensor(self.start, device=device)[:, None]).long()


def with_zero_rows(states: torch.Tensor, rows: int) -> torch.Tensor:
    """`states` [batch, heads, columns, dim] with `rows` rows of zeros after its own."""
    if not rows:
        return states
    return torch.cat([states, states.new_zeros((rows, *states.shape[1:]))])
