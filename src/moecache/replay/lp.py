"""The exact fewest copies at any size: a linear program over bridged gaps (docs/optimum.md).

A stream is T tokens, token t requesting the set S_t of k experts; the cache holds C. A
lossless schedule keeps every expert of S_t resident while token t is computed; prefetching
is allowed and dropping is free. Copies are all insertions over the stream, first loads
included (what `optimum.exact_insertions` returns; `after_fill` subtracts min(C, distinct):
records/counting.after_fill).

If expert e is requested at tokens u_1 < u_2 < ... < u_m, its gaps are the pairs
(u_i, u_{i+1}). A schedule either keeps e resident over all of u_i..u_{i+1} (it bridges the
gap, for free) or drops it somewhere in between and pays one copy to have it back by
u_{i+1}. So copies = (distinct experts) + (gaps not bridged), and a set of bridged gaps is
feasible exactly when, at every token t, the bridged gaps strictly spanning t (u_i < t <
u_{i+1}) number at most C - |S_t|. Gaps with u_{i+1} = u_i + 1 span no token and are always
bridged. With x_g in [0, 1] per gap of length >= 1:

    maximise  sum_g w_g x_g   subject to   sum_{g spans t} x_g <= C - |S_t|   for every t

with w_g = 1 (or the cost of reloading g's expert). Each column's ones are the run of
tokens its gap spans, so the matrix is an interval matrix, totally unimodular, and every
vertex is integral: the simplex optimum is a schedule. We check that (`max_fractionality`)
and certify the optimum with the dual (`lower_bound`), independently of the solver's word.

The solver needs only numpy and highspy; `benchmark` times farthest-future beside it,
replayed by moecache.replay.engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.farthest_future import FarthestFuture
from moecache.records import counting, demand
from moecache.records.shape import check_shape
from moecache.replay import engine

PAD = -1  # requests[t] past the end of a stream: the whole token is PAD
INTEGRAL_TOL = 1e-6  # a variable this close to 0 or 1 counts as integral
_CERTIFY_TOL = 1e-6  # relative slack between the schedule's cost and the dual bound


@dataclass
class Gaps:
    """One stream's gaps of length >= 1 (the LP's variables), by the expert's two uses."""

    expert: np.ndarray  # [G] expert id
    start: np.ndarray  # [G] token of the earlier use (a); the gap spans a+1 .. b-1
    end: np.ndarray  # [G] token of the next use (b)
    tokens: int  # the stream's length
    distinct: int  # experts requested at least once (each is loaded at least once)
    first_experts: np.ndarray  # [distinct] their ids
    width: np.ndarray  # [tokens] |S_t|


@dataclass
class StreamOptimum:
    """The least-cost lossless schedule of one stream, from the LP."""

    cost: float  # least total copy cost (unit costs: the fewest insertions, first loads included)
    copies: int  # insertions that schedule makes (= cost at unit cost)
    after_fill: int  # copies beyond the first min(C, distinct): the paper's steady traffic B
    distinct: int  # experts requested at least once
    gaps: int  # gaps with a token between the two uses (LP variables)
    bridged: int  # of which the optimum bridges
    lower_bound: float  # the dual bound: no lossless schedule costs less
    certified: bool  # cost == lower_bound (to 1e-6 relative): optimal, checked without HiGHS
    integral: bool  # the LP solution is 0/1 (to INTEGRAL_TOL) and feasible once rounded
    max_fractionality: float  # the largest distance of a variable from an integer
    status: str  # HiGHS's model status ("Optimal"; "Optimal" too when there is no gap)
    seconds: float  # time to build and solve
    bridged_gaps: np.ndarray | None = None  # [bridged, 3] (expert, a, b), when asked for


@dataclass
class Optimum:
    """Per-stream optima of a [streams, T, k] demand and their totals."""

    streams: list[StreamOptimum]
    seconds: float = 0.0
    cost: float = field(init=False)
    copies: np.ndarray = field(init=False)  # [streams] insertions of the optimum
    after_fill: np.ndarray = field(init=False)  # [streams] steady traffic B*
    integral: bool = field(init=False)  # every stream's solution integral
    certified: bool = field(init=False)  # every stream's optimum certified by its dual
    max_fractionality: float = field(init=False)

    def __post_init__(self):
        s = self.streams
        self.cost = float(sum(o.cost for o in s))
        self.copies = np.array([o.copies for o in s], dtype=np.int64)
        self.after_fill = np.array([o.after_fill for o in s], dtype=np.int64)
        self.integral = all(o.integral for o in s)
        self.certified = all(o.certified for o in s)
        self.max_fractionality = max((o.max_fractionality for o in s), default=0.0)


# -- input ------------------------------------------------------------------------------


def _stream(requests, num_experts: int, capacity: int, where: str = "") -> np.ndarray:
    """Checked [L, k] int64 requests without the trailing PAD tokens."""
    requests = np.asarray(requests)
    at = f"{where}: " if where else ""
    if requests.ndim != 2:
        raise MoecacheError(f"lp: {at}requests must be [tokens, k], got shape {requests.shape}")
    if requests.size and not np.issubdtype(requests.dtype, np.integer):
        raise MoecacheError(f"lp: {at}expert ids must be integers, got {requests.dtype}")
    if num_experts < 1:
        raise MoecacheError(f"lp: need at least 1 expert, got {num_experts}")
    k = requests.shape[1]
    check_shape(k or None, capacity, where="lp")
    requests = requests.astype(np.int64)
    pad = (requests == PAD).all(axis=1) if k else np.zeros(len(requests), dtype=bool)
    real_rows = np.flatnonzero(~pad)
    length = int(real_rows[-1]) + 1 if len(real_rows) else 0  # PAD only after the end
    real = requests[:length]
    # PAD may end a narrower token (a batched union), never fill one before the end.
    bad = (real < 0) & ((real != PAD) | (real == PAD).all(axis=1, keepdims=True))
    bad |= real >= num_experts
    if bad.any():
        t, j = np.argwhere(bad)[0]
        raise MoecacheError(
            f"lp: {at}token {t} requests expert {real[t, j]}, outside 0..{num_experts - 1}"
        )
    ordered = np.sort(real, axis=1)
    repeated = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != PAD)).any(axis=1)
    if repeated.any():
        raise MoecacheError(f"lp: {at}token {int(np.argmax(repeated))} requests an expert twice")
    return real


def _costs(costs, num_experts: int) -> np.ndarray | None:
    if costs is None:
        return None
    costs = np.asarray(costs, dtype=np.float64)
    if costs.shape != (num_experts,):
        raise MoecacheError(f"lp: costs must be one per expert ({num_experts}), got {costs.shape}")
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise MoecacheError("lp: costs must be finite and non-negative")
    return costs


def gaps(requests: np.ndarray) -> Gaps:
    """The gaps of a checked [L, k] stream: consecutive uses of one expert at least two
    tokens apart."""
    length, k = requests.shape
    real = requests.ravel() != PAD  # a batched union may request fewer than k (PAD after)
    e = requests.ravel()[real]
    t = np.repeat(np.arange(length, dtype=np.int64), k)[real]
    order = np.lexsort((t, e))
    e, t = e[order], t[order]
    same = e[1:] == e[:-1]
    a, b, expert = t[:-1][same], t[1:][same], e[1:][same]
    keep = b - a >= 2
    first = e[np.concatenate(([True], ~same))] if len(e) else e
    return Gaps(
        expert[keep], a[keep], b[keep], length, len(first), first, (requests != PAD).sum(axis=1)
    )


# -- the LP -----------------------------------------------------------------------------


def dual_bound(g, y, room, weight, offset: float) -> float:
    """The least cost bounded from below: for any y >= 0, what bridging saves is at most
    sum_t room_t y_t + sum_g max(0, w_g - y(g)) (the LP's dual, y its row duals)."""
    y = np.maximum(y, 0.0)
    y_span = _span_sums(g, y, per_gap=True)
    return offset - float(room @ y + np.maximum(weight - y_span, 0.0).sum())


def solve_stream(
    requests,
    num_experts: int,
    capacity: int,
    costs=None,
    return_gaps: bool = False,
    highs: highspy.Highs | None = None,
) -> StreamOptimum:
    """The least-cost lossless schedule of one stream, prefetching allowed.

    `requests`: int [T, k] expert ids in 0..N-1, distinct within a token, optionally
    followed by whole tokens of PAD (-1). `costs`: per-expert reload cost [N] (default 1
    each: the result counts insertions). `highs`: a Highs object to reuse (cleared here).
    """
    begin = time.perf_counter()
    stream = _stream(requests, num_experts, capacity)
    w_expert = _costs(costs, num_experts)
    g = gaps(stream)
    weight = np.ones(len(g.expert)) if w_expert is None else w_expert[g.expert]
    first_cost = float(g.distinct if w_expert is None else w_expert[g.first_experts].sum())
    offset = first_cost + float(weight.sum())  # the cost when nothing is bridged
    room = (capacity - g.width).astype(np.float64)  # [L] slots free for bridged gaps

    if len(weight) == 0:
        x, status, y = np.zeros(0), "Optimal", np.zeros(g.tokens)
    else:
        x, status, y = _highs(g, weight, room, offset, highs)

    rounded = np.round(x)
    frac = float(np.abs(x - rounded).max(initial=0.0))
    load = _span_sums(g, rounded)
    integral = frac <= INTEGRAL_TOL and bool((load <= room + 1e-9).all())
    bridged = rounded > 0.5
    if integral:
        cost = offset - float(weight[bridged].sum())
    else:  # never seen (TU); fall back to the LP value, which is still the optimum
        cost = offset - float(weight @ x)
    copies = g.distinct + int((~bridged).sum())

    lower = dual_bound(g, y, room, weight, offset)
    certified = cost - lower <= _CERTIFY_TOL * max(1.0, abs(cost))
    return StreamOptimum(
        cost=cost,
        copies=copies,
        after_fill=int(counting.after_fill(copies, g.distinct, capacity)),
        distinct=g.distinct,
        gaps=len(weight),
        bridged=int(bridged.sum()),
        lower_bound=lower,
        certified=bool(certified),
        integral=integral,
        max_fractionality=frac,
        status=status,
        seconds=time.perf_counter() - begin,
        bridged_gaps=(
            np.stack([g.expert, g.start, g.end], axis=1)[bridged] if return_gaps else None
        ),
    )


def _highs(g: Gaps, weight, room, offset, highs):
    """Solve min offset - w.x s.t. A x <= room, 0 <= x <= 1; A column-wise, one run per gap.
    Returns x, the model status and y = -row duals (>= 0 at a dual-feasible optimum)."""
    lengths = g.end - g.start - 1
    starts = np.concatenate(([0], np.cumsum(lengths)))
    nnz = int(starts[-1])
    index = np.arange(nnz, dtype=np.int64) + np.repeat(g.start + 1 - starts[:-1], lengths)

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(weight), g.tokens
    lp.col_cost_ = -weight
    lp.col_lower_ = np.zeros(len(weight))
    lp.col_upper_ = np.ones(len(weight))
    lp.row_lower_ = np.full(g.tokens, -highspy.kHighsInf)
    lp.row_upper_ = room
    lp.offset_ = offset
    lp.sense_ = highspy.ObjSense.kMinimize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = index.astype(np.int32)
    lp.a_matrix_.value_ = np.ones(nnz)
    if highs is None:
        highs = _new_highs()
    else:
        highs.clearModel()
    highs.passModel(lp)
    highs.run()
    status = highs.modelStatusToString(highs.getModelStatus())
    if status != "Optimal":
        raise MoecacheError(f"lp: HiGHS stopped with status {status!r}")
    solution = highs.getSolution()
    x = np.asarray(solution.col_value, dtype=np.float64)
    y = -np.asarray(solution.row_dual, dtype=np.float64)
    return x, status, y


def _new_highs() -> highspy.Highs:
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("solver", "simplex")  # a vertex, hence integral
    highs.setOptionValue("threads", 1)
    return highs


def _span_sums(g: Gaps, values, per_gap: bool = False):
    """per_gap False: for each token, the sum of `values` [G] over gaps spanning it.
    per_gap True: `values` [L] per token; for each gap, their sum over the tokens it spans."""
    if per_gap:
        prefix = np.concatenate(([0.0], np.cumsum(values)))
        return prefix[g.end] - prefix[g.start + 1]
    diff = np.zeros(g.tokens + 1)
    np.add.at(diff, g.start + 1, values)
    np.add.at(diff, g.end, -values)
    return np.cumsum(diff)[: g.tokens]


def solve(
    requests, num_experts: int, capacity: int, costs=None, return_gaps: bool = False
) -> Optimum:
    """`solve_stream` on every stream of a [streams, T, k] demand padded with PAD."""
    begin = time.perf_counter()
    requests = np.asarray(requests)
    if requests.ndim != 3:
        raise MoecacheError(f"lp: requests must be [streams, T, k], got shape {requests.shape}")
    highs = _new_highs()
    out = []
    for s, stream in enumerate(requests):
        try:
            out.append(solve_stream(stream, num_experts, capacity, costs, return_gaps, highs))
        except MoecacheError as error:
            raise MoecacheError(f"stream {s}: {error}") from None
    return Optimum(out, time.perf_counter() - begin)


# -- benchmark --------------------------------------------------------------------------


def drifting(
    rng: np.random.Generator, streams: int, tokens: int, num_experts: int, top_k: int
) -> np.ndarray:
    """Random demand [streams, tokens, top_k] with a drifting working set: each of the
    previous token's experts stays with probability 0.75, the rest are drawn uniformly."""
    out = np.empty((streams, tokens, top_k), dtype=np.int64)
    for s in range(streams):
        current = rng.choice(num_experts, top_k, replace=False)
        for t in range(tokens):
            if t:
                keep = current[rng.random(top_k) < 0.75]
                fresh = np.setdiff1d(np.arange(num_experts), keep)
                current = np.concatenate(
                    [keep, rng.choice(fresh, top_k - len(keep), replace=False)]
                )
            out[s, t] = np.sort(current)
    return out


def benchmark(
    requests=None,
    num_experts: int = 64,
    capacity: int = 32,
    top_k: int = 8,
    tokens: int = 384,
    streams: int = 16,
    seed: int = 0,
) -> dict:
    """Time the LP on every stream of a demand padded with PAD (by default a random
    OLMoE-sized one: 16 streams x 384 tokens x 8 of 64 experts, C = 32) beside
    farthest-future replayed; both count copies with first loads."""
    if requests is None:
        requests = drifting(np.random.default_rng(seed), streams, tokens, num_experts, top_k)
    requests = np.asarray(requests)
    optimum = solve(requests, num_experts, capacity)
    names = [str(s) for s in range(len(requests))]
    lengths = (requests != PAD).any(axis=2).sum(axis=1)  # PAD only after a stream's end
    replayed = demand.Demand(names, names, requests, lengths, num_experts)
    begin = time.perf_counter()
    rule = FarthestFuture(capacity, num_experts, replayed.top_k)
    ff = engine.run(replayed, rule).insertions
    greedy_seconds = time.perf_counter() - begin
    return {
        "streams": int(requests.shape[0]),
        "tokens": int(requests.shape[1]),
        "experts": num_experts,
        "top_k": int(requests.shape[2]),
        "capacity": capacity,
        "lp_seconds": optimum.seconds,
        "lp_ms_per_stream": 1e3 * optimum.seconds / max(1, len(optimum.streams)),
        "variables": int(sum(o.gaps for o in optimum.streams)),
        "optimum": optimum.cost,
        "farthest_future": float(ff.sum()),
        "farthest_future_seconds": greedy_seconds,
        "integral": optimum.integral,
        "certified": optimum.certified,
        "max_fractionality": optimum.max_fractionality,
    }
