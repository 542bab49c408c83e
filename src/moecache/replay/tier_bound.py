"""The least cost of any demand-driven schedule over two tiers, with or without bypass: an
integer program solved by HiGHS (docs/tiers.md).

A schedule is demand-driven: an expert enters the device only at a token that requests
it (a copy from the host), and enters the host only at a token whose device misses it (a
read from disk): what every replayed rule does (replay/tiers.py). Dropping is free. For
one tier without bypass this is the schedule class of B* (docs/optimum.md shows that
prefetching cannot beat it there); with two tiers, moving an expert ahead of need can
trade device room for host room, which this bound leaves out.

Expert e requested at tokens u_1 < ... < u_m has uses i and gaps (u_i, u_{i+1}). Per use,
a_i = 1 when it is served on the device (fixed to 1 without bypass; else the host computes
it) and z_i = 1 when the host holds e at u_i; per gap, x_g = 1 when the device keeps e
through it and y_g = 1 when the host does. Then, g the gap before use i (none: 0),

    copies_i = a_i - x_g,  computes_i = 1 - a_i,  reads_i = z_i - y_g
    minimise  f * sum copies + h * sum computes + r * sum reads

subject to x_g <= a at both ends, y_g <= z at both ends; the host holds what a use needs
(z_i >= 1 - x_g: a copy or a compute reads the host) and takes nothing else in
(z_i <= y_g + 1 - x_g); and at every token the uses there plus the gaps spanning it number
at most C on the device (the a's and x's) and at most H on the host (the z's and y's).
Without a host bound (H = None) the z's and y's and the read terms go. HiGHS solves it to
proven optimality (its dual bound meets the schedule's cost: `certified`); the LP
relaxation is reported beside it, a bound that needs no branching.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from moecache.errors import MoecacheError
from moecache.records.demand import PAD
from moecache.records.shape import check_shape
from moecache.replay import lp

_CERTIFY_TOL = 1e-6  # relative: the schedule's cost against HiGHS's dual bound


@dataclass(frozen=True)
class Prices:
    """Cost of one event, in any unit (ms in the config): a host to device copy, a disk to
    host read, a host compute."""

    copy: float
    read: float
    compute: float


@dataclass
class TierOptimum:
    """One stream's least-cost schedule and its certificate."""

    cost: float
    copies: int
    reads: int
    computes: int
    dual_bound: float  # HiGHS's: no schedule of the class costs less
    relaxation: float  # the LP relaxation's optimum, a lower bound without branching
    certified: bool  # cost meets dual_bound (to 1e-6 relative)
    seconds: float


class Program:
    """The program's columns and rows, added as they come."""

    def __init__(self):
        self.cost, self.upper, self.lower = [], [], []
        self.rows, self.cols, self.vals, self.row_low, self.row_high = [], [], [], [], []

    def columns(self, count: int, cost: float, low: float = 0.0) -> np.ndarray:
        first = len(self.cost)
        self.cost += [cost] * count
        self.lower += [low] * count
        self.upper += [1.0] * count
        return np.arange(first, first + count)

    def row(self, terms, low=-highspy.kHighsInf, high=highspy.kHighsInf) -> None:
        """sum of coef * column over `terms` [(column, coef), ...] within [low, high]."""
        r = len(self.row_low)
        for column, coef in terms:
            self.rows.append(r)
            self.cols.append(int(column))
            self.vals.append(float(coef))
        self.row_low.append(float(low))
        self.row_high.append(float(high))

    def solve(self, offset: float, integer: bool, seconds: float | None = None, start=None):
        """(objective, column values, dual bound) of min cost.x + offset; an integer
        program stopped after `seconds` gives its best schedule and HiGHS's bound then.
        `start`: column values of a known schedule, HiGHS's first incumbent."""
        model = highspy.HighsLp()
        n, m = len(self.cost), len(self.row_low)
        model.num_col_, model.num_row_ = n, m
        model.col_cost_ = np.array(self.cost)
        model.col_lower_, model.col_upper_ = np.array(self.lower), np.array(self.upper)
        model.row_lower_, model.row_upper_ = np.array(self.row_low), np.array(self.row_high)
        model.offset_ = offset
        order = np.lexsort((np.array(self.rows), np.array(self.cols)))
        cols, rows = np.array(self.cols, dtype=np.int64)[order], np.array(self.rows)[order]
        model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        model.a_matrix_.start_ = np.searchsorted(cols, np.arange(n + 1)).astype(np.int32)
        model.a_matrix_.index_ = rows.astype(np.int32)
        model.a_matrix_.value_ = np.array(self.vals)[order]
        if integer:
            model.integrality_ = [highspy.HighsVarType.kInteger] * n
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("threads", 1)
        highs.setOptionValue("mip_rel_gap", 0.0)
        if seconds is not None:
            highs.setOptionValue("time_limit", float(seconds))
        highs.passModel(model)
        if start is not None:
            given = highspy.HighsSolution()
            given.col_value = list(map(float, start))
            highs.setSolution(given)
        highs.run()
        status = highs.modelStatusToString(highs.getModelStatus())
        stopped = status == "Time limit reached" and highs.getInfo().primal_solution_status == 2
        if status != "Optimal" and not stopped:
            raise MoecacheError(f"tier bound: HiGHS stopped with status {status!r}")
        info = highs.getInfo()
        value = info.objective_function_value
        bound = info.mip_dual_bound if integer else value
        return value, np.asarray(highs.getSolution().col_value), bound


def uses(requests: np.ndarray):
    """Every (expert, token) use, sorted by expert then token, and whether each use's
    predecessor is the same expert's previous use (the gap before it)."""
    length, k = requests.shape
    real = requests.ravel() != PAD
    e = requests.ravel()[real]
    t = np.repeat(np.arange(length, dtype=np.int64), k)[real]
    order = np.lexsort((t, e))
    e, t = e[order], t[order]
    follows = np.concatenate(([False], e[1:] == e[:-1]))
    return e, t, follows


def solve_stream(
    requests,
    num_experts: int,
    capacity: int,
    host: int | None,
    bypass: bool,
    prices: Prices,
    seconds: float | None = None,
    start: tuple | None = None,
) -> TierOptimum:
    """The least-cost demand-driven schedule of one stream [T, k] (PAD tokens after its
    end), over a host of `host` experts (None: every expert, no disk). After `seconds` the
    search stops with its best schedule, `certified` false and the dual bound below it.
    `start`: a replayed schedule to begin from, (device, host) as tiers.run keeps them
    ([T, N] contents after each token; host None without a disk)."""
    begin = time.perf_counter()
    stream = lp._stream(requests, num_experts, capacity)
    if host is not None:
        check_shape(None, capacity, num_experts, host, where="tier bound")
    expert, token, follows = uses(stream)
    count = len(expert)
    prog = Program()
    # a_i: served on the device (cost f - h per use, h * uses in the offset).
    a = prog.columns(count, prices.copy - prices.compute, low=0.0 if bypass else 1.0)
    gap_end = np.flatnonzero(follows)  # use i whose gap before it is g
    x = prog.columns(len(gap_end), -prices.copy)
    for g, i in enumerate(gap_end):
        prog.row([(x[g], 1), (a[i - 1], -1)], high=0)
        prog.row([(x[g], 1), (a[i], -1)], high=0)
    spans = [(token[i - 1] + 1, token[i]) for i in gap_end]  # tokens strictly inside
    capacity_rows(prog, token, a, spans, x, len(stream), capacity)
    if host is not None:
        z, y = host_rows(prog, prices, token, x, gap_end, spans, len(stream), host)
    offset = prices.compute * count
    relaxation = prog.solve(offset, integer=False)[0]
    values = None
    if start is not None:
        values = started(start, expert, token, gap_end, host is not None, bypass)
    cost, value, bound = prog.solve(offset, integer=True, seconds=seconds, start=values)
    value = np.round(value)
    served, kept = value[a], np.zeros(count)
    kept[gap_end] = value[x]
    reads = 0 if host is None else int(value[z].sum() - value[y].sum())
    certified = abs(cost - bound) <= _CERTIFY_TOL * max(1.0, abs(cost))
    return TierOptimum(
        cost=float(cost),
        copies=int((served - kept).sum()),
        reads=reads,
        computes=int(count - served.sum()),
        dual_bound=float(bound),
        relaxation=float(relaxation),
        certified=bool(certified),
        seconds=time.perf_counter() - begin,
    )


def host_rows(prog, prices: Prices, token, x, gap_end, spans, tokens: int, host: int):
    """The host tier's columns and rows: z_i, use i read into host memory (a first use is
    read in, copied or computed), y_g, gap g kept in host memory between its two uses (both
    read), at most H experts kept at each token. Returns (z, y)."""
    count = len(token)
    z = prog.columns(count, prices.read)
    y = prog.columns(len(gap_end), -prices.read)
    before = {int(i): g for g, i in enumerate(gap_end)}
    for i in range(count):
        g = before.get(i)
        if g is None:
            prog.row([(z[i], 1)], low=1)  # a first use: copied or computed, read in
            continue
        prog.row([(z[i], 1), (x[g], 1)], low=1)
        prog.row([(z[i], 1), (y[g], -1), (x[g], 1)], high=1)
        prog.row([(y[g], 1), (z[i - 1], -1)], high=0)
        prog.row([(y[g], 1), (z[i], -1)], high=0)
    capacity_rows(prog, token, z, spans, y, tokens, host)
    return z, y


def started(start, expert, token, gap_end, with_host: bool, bypass: bool) -> np.ndarray:
    """The program's columns (a, x, then z, y) for a replayed demand-driven schedule: a use
    is on the device if the expert is there after its token, a gap kept if the expert is
    there after its first use and still before its second (it enters only at uses)."""
    device, host = start
    a = device[token, expert]
    if not bypass and not a.all():
        raise MoecacheError("tier bound: a start without bypass serves every use on the device")
    before = token[gap_end] - 1
    x = a[gap_end - 1] & device[before, expert[gap_end]]
    columns = [a, x]
    if with_host:
        z = host[token, expert]
        # Kept through and still held at the second use (a host step there may evict it).
        columns += [z, z[gap_end - 1] & host[before, expert[gap_end]] & z[gap_end]]
    return np.concatenate(columns).astype(np.float64)


def capacity_rows(prog: Program, token, at_use, spans, bridged, tokens: int, room: int) -> None:
    """At every token: the uses there held (columns `at_use`) plus the gaps spanning it
    kept (columns `bridged`) number at most `room`."""
    terms: list[list] = [[] for _ in range(tokens)]
    for i, t in enumerate(token):
        terms[t].append((at_use[i], 1))
    for g, (first, end) in enumerate(spans):
        for t in range(first, end):
            terms[t].append((bridged[g], 1))
    for row in terms:
        if len(row) > room:  # else it cannot bind
            prog.row(row, high=room)
