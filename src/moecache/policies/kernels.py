"""Compiled event rules: an EventPolicy whose hooks are numba functions over state arrays.

A rule keeps every stream's state in one NamedTuple of arrays indexed [stream, expert] (or
[stream] for a counter or a hand), made by `new_state(streams)`, and names its numba
hooks for its State class, `register(State, on_hit, on_miss, victim, on_evict,
on_insert, on_token=learns_nothing)`: on_hit(s, row, e), on_miss(s, row, e), victim(s,
row, e, busy) -> v, on_evict(s, row, v), on_insert(s, row, e), called in EventPolicy's
order, then on_token(s, row, request) once the token's experts are in (the whole request
in its order: where LRU and farthest-future learn). `busy[x]` is true for the current
token's experts, never a valid victim. The same compiled `run` (a stream's tokens, in
order) serves the harness (`change`, one stream), replay's `step` (many streams, one token)
and `replay_streams` (every stream start to end in one call, no Python per token): a
rule's copies are defined once, and replay runs at compiled speed. Replay takes this one
path for every rule with a compiled state (EvictionPolicy.compiled_state): the zoo's
CompiledEventPolicy, and LRU and farthest-future, whose hooks sit beside their
vectorised ranking.

Ordered lists (queues, LRU lists, ghosts) are a list id per expert (`where`) and a stamp
that grows per stream (`stamp`, `clock`), with each list's length kept (`held`): the
oldest entry is the lowest stamp. With N experts per layer (64 to 256) a scan of N
costs less than links would (measured: linked lists, four arrays more, ran slower).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections import namedtuple
from pathlib import Path

import numpy as np
from numba import njit
from numba.core.caching import CompileResultCacheImpl, FunctionCache, UserProvidedCacheLocator
from numba.core.extending import overload

from moecache.errors import MoecacheError
from moecache.policies.event_driven import EventPolicy
from moecache.policies.pools import OUTSIDE, StepChange
from moecache.records import counting


def cache_folder() -> str:
    """Where compiled drivers are kept: a folder named by the hash of every rule's source
    (and of the counting rule they compile in, records/counting.py). Numba checks only the
    cached function's own file for changes, and the drivers compile in the hooks of other
    files; a new folder per source version keeps that from ever serving stale code."""
    here = Path(__file__).parent
    sources = sorted(here.glob("*.py")) + [here.parent / "records" / "counting.py"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    root = os.environ.get("NUMBA_CACHE_DIR") or Path.home() / ".cache" / "moecache-numba"
    for folder in (Path(root) / digest, Path(tempfile.gettempdir()) / "moecache-numba" / digest):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return str(folder)
        except OSError:
            continue
    return ""


FOLDER = cache_folder()


class RuleSourcesLocator(UserProvidedCacheLocator):
    """Numba's locator of a user-given cache folder, given FOLDER for the functions compiled
    with `compiled` instead of the process-wide numba.config.CACHE_DIR (left as it is)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(FOLDER, self.get_suitable_cache_subpath(py_file))

    @classmethod
    def from_function(cls, py_func, py_file):
        if not FOLDER:  # nowhere writable: numba's own locators, as for any cached function
            return None
        return super(UserProvidedCacheLocator, cls).from_function(py_func, py_file)


class RuleSourcesCacheImpl(CompileResultCacheImpl):
    _locator_classes = [RuleSourcesLocator, *CompileResultCacheImpl._locator_classes]


class RuleSourcesCache(FunctionCache):
    _impl_class = RuleSourcesCacheImpl


def compiled(function):
    """njit(cache=True), per function: `function` compiled once and kept on disk in FOLDER,
    the folder of this version of the rules' sources. Numba's global config is not touched;
    the cache is the one numba.njit(cache=True) installs (Dispatcher.enable_caching), with
    this locator first."""
    dispatcher = njit(function)
    dispatcher._cache = RuleSourcesCache(dispatcher.py_func)
    return dispatcher


# The counting rule (records/counting.py), compiled into the replay drivers.
has_been_full = njit(inline="always")(counting.has_been_full)
FAR = np.iinfo(np.int64).max
LISTS = 8  # list ids a rule may use, 0 (none) included


@njit(inline="always")
def nothing(s, row, e):
    """A hook the rule does not need."""


@njit(inline="always")
def learns_nothing(s, row, request):
    """An on_token hook the rule does not need."""


@njit(inline="always")
def oldest(s, row, queue, busy):
    """The expert of stream `row` in list `queue` with the lowest stamp that the token does
    not need (-1: none). The arrays are taken out of the state once: an access
    through the tuple inside the loop costs a reference count each time."""
    where, stamp, best, found = s.where, s.stamp, FAR, -1
    for x in range(where.shape[1]):
        if where[row, x] == queue and stamp[row, x] < best and not busy[x]:
            best, found = stamp[row, x], x
    return found


@njit(inline="always")
def lowest(s, row, e, busy):
    """A victim hook for a rule that keys each resident in s.key [streams, N] and every
    other expert FAR (LRU, farthest-future): the lowest key the token does not need, ties
    to the lowest id (-1: none)."""
    key, best, found = s.key, FAR, -1
    for x in range(key.shape[1]):
        if key[row, x] < best and not busy[x]:
            best, found = key[row, x], x
    return found


@njit(inline="always")
def unkey(s, row, e):
    """The on_evict hook beside `lowest`: e leaves the pool, keyed FAR."""
    s.key[row, e] = FAR


@njit(inline="always")
def following(s, row, queue, low=0):
    """The oldest expert of list `queue` stamped `low` or later, needed or not (-1: none);
    with low = 0 the list's oldest."""
    where, stamp, best, found = s.where, s.stamp, FAR, -1
    for x in range(where.shape[1]):
        if where[row, x] == queue and low <= stamp[row, x] < best:
            best, found = stamp[row, x], x
    return found


@njit(inline="always")
def size(s, row, queue):
    """How many experts list `queue` holds (counted as they move, not scanned)."""
    return s.held[row, queue]


@njit(inline="always")
def put(s, row, e, queue):
    """Expert e enters list `queue` at its newest end (0: leaves every list)."""
    drop(s, row, e)
    s.where[row, e] = queue
    s.held[row, queue] += 1
    s.clock[row] += 1
    s.stamp[row, e] = s.clock[row]


@njit(inline="always")
def drop(s, row, e):
    """Expert e leaves its list."""
    s.held[row, s.where[row, e]] -= 1
    s.where[row, e] = 0


@njit(inline="always")
def remember(s, row, e, ghosts, length):
    """Evicted e joins the ghost list `ghosts` (ids only), which keeps its `length` newest."""
    if length:
        put(s, row, e, ghosts)
        if size(s, row, ghosts) > length:
            drop(s, row, following(s, row, ghosts))


@njit(inline="always")
def recall(s, row, e, ghosts):
    """On a miss: s.seen[row] is whether e is remembered in the ghost list `ghosts`,
    which then forgets it (e is about to be resident)."""
    s.seen[row] = s.where[row, e] == ghosts
    if s.seen[row]:
        drop(s, row, e)


@njit(inline="always")
def evict_remembering(s, row, e, source, ghosts, length):
    """Evicted e leaves its list; if that was `source`, the ghost list `ghosts` (of
    `length`) remembers it."""
    was = s.where[row, e]
    drop(s, row, e)
    if was == source:
        remember(s, row, e, ghosts, length)


def lists(streams: int, width: int) -> dict:
    """The arrays of ordered lists, for a rule's state: where (list 0: none, at most
    LISTS - 1), stamp, clock, and held, each list's length."""
    return {
        "where": np.zeros((streams, width), dtype=np.int64),
        "stamp": np.zeros((streams, width), dtype=np.int64),
        "clock": np.zeros(streams, dtype=np.int64),
        "held": np.zeros((streams, LISTS), dtype=np.int64),
    }


LIST_FIELDS = ("where", "stamp", "clock", "held")


def state_type(module: str, *fields: str) -> type:
    """A rule's State class: a NamedTuple of the ordered lists' arrays (LIST_FIELDS, made by
    `lists`), then the rule's own `fields`. It is named State in the rule's `module`, where
    numba's disk cache finds it again."""
    return namedtuple("State", LIST_FIELDS + fields, module=module)


HOOKS: dict[type, tuple] = {}  # a rule's State class -> its six hooks


def register(
    state: type, on_hit, on_miss, victim, on_evict, on_insert, on_token=learns_nothing
) -> None:
    """Name a rule's hooks for its State class: the drivers find them by the type of the
    state they are given, so they are plain cached functions (one compilation per rule,
    kept on disk) with the hooks compiled in."""
    HOOKS[state] = (on_hit, on_miss, victim, on_evict, on_insert, on_token)


def register_keyed(state: type, on_token) -> None:
    """A rule whose residents hold a key learnt once each token is in (`on_token`; LRU's
    recency, farthest-future's rank): the victim is the lowest key, and evicting unkeys."""
    register(state, nothing, nothing, lowest, unkey, nothing, on_token)


# Python stubs of the hooks the drivers call; each overload below resolves one, at compile
# time, to the hook registered for the state's class.
def on_hit(s, row, e): ...
def on_miss(s, row, e): ...
def victim(s, row, e, busy): ...
def on_evict(s, row, e): ...
def on_insert(s, row, e): ...
def on_token(s, row, request): ...


def resolver(stub, place: int):
    """The typing function of `stub`: the hook registered at `place` for the state's class.
    It wears the stub's signature (functools.wraps), which numba matches to the hook's."""

    @functools.wraps(stub)
    def resolve(s, *args):
        return HOOKS[s.instance_class][place].py_func

    return resolve


for place, stub in enumerate((on_hit, on_miss, victim, on_evict, on_insert, on_token)):
    overload(stub, inline="always")(resolver(stub, place))


@compiled
def run(s, row, requests, held, capacity, busy, resident, missed, victims, copies, full):
    """Tokens requests [T, k] (expert ids) of stream `row`, in order, into its pool
    (resident [N], holding `held`): per token its hits, then per miss room and insertion,
    then on_token. Writes each token's copies[t] and full[t] (whether the pool had been
    full before it, records/counting.py) and the last token's victims at victims[:nv];
    returns nv, or -1 for an invalid victim. Replay calls it once per stream: a call per
    token took about twice as long at one expert per token (measured)."""
    k = requests.shape[1]
    been_full, nv = has_been_full(False, held, capacity), 0
    for t in range(len(requests)):
        request, misses, nv = requests[t], 0, 0
        for j in range(k):
            busy[request[j]] = True
            missed[j] = not resident[request[j]]
            misses += missed[j]
        for j in range(k):
            if not missed[j]:
                on_hit(s, row, request[j])
        free = capacity - held
        for j in range(k):
            if not missed[j]:
                continue
            e = request[j]
            on_miss(s, row, e)
            if free > 0:
                free -= 1
            else:
                v = victim(s, row, e, busy)
                if v < 0 or busy[v] or not resident[v]:
                    return -1
                on_evict(s, row, v)
                resident[v] = False
                victims[nv] = v
                nv += 1
            on_insert(s, row, e)
            resident[e] = True
        for j in range(k):
            busy[request[j]] = False
        on_token(s, row, request)
        copies[t], full[t] = misses, been_full
        held = min(capacity, held + misses)
        been_full = has_been_full(been_full, held, capacity)
    return nv


@compiled
def step_streams(s, requests, count, capacity, resident):
    """Token t of the first n streams: requests [n, k] (expert ids), count [n] residents
    before, resident [n, N] (updated). Returns flat victims (row * N + expert) and
    whether every victim was valid."""
    (n, width), k = resident.shape, requests.shape[1]
    busy = np.zeros(width, dtype=np.bool_)
    missed = np.empty(k, dtype=np.bool_)
    out = np.empty(n * k, dtype=np.int64)
    local = np.empty(k, dtype=np.int64)
    copies, full = np.empty(1, dtype=np.int64), np.empty(1, dtype=np.bool_)
    total = 0
    for row in range(n):
        one = requests[row : row + 1]
        got = run(
            s, row, one, count[row], capacity, busy, resident[row], missed, local, copies, full
        )
        if got < 0:
            return out[:0], False
        for i in range(got):
            out[total + i] = row * width + local[i]
        total += got
    return out[:total], True


@compiled
def replay_streams(s, requests, lengths, capacity, width):
    """Every stream from its first token to its last: copies [S, T] per token and whether
    the pool had been full before it (the harness's fills / steady split,
    records/counting.py)."""
    streams, steps, k = requests.shape
    copies = np.zeros((streams, steps), dtype=np.int64)
    full = np.zeros((streams, steps), dtype=np.bool_)
    busy = np.zeros(width, dtype=np.bool_)
    resident = np.zeros(width, dtype=np.bool_)
    missed = np.empty(k, dtype=np.bool_)
    victims = np.empty(k, dtype=np.int64)
    for row in range(streams):
        resident[:] = False
        mine = requests[row, : lengths[row]]
        if (
            run(s, row, mine, 0, capacity, busy, resident, missed, victims, copies[row], full[row])
            < 0
        ):
            return copies, full, False
    return copies, full, True


class CompiledEventPolicy(EventPolicy):
    """An EventPolicy whose hooks are numba functions (see the module docstring)."""

    def new_state(self, streams: int):
        """Every stream's state: a NamedTuple of arrays, [streams, N] or [streams]
        (EventPolicy.reset makes it; no new_stream here)."""
        raise NotImplementedError

    def step(self, t: int, at: np.ndarray, probs, pools) -> StepChange:
        n = len(at)
        requests = at - self.start[:n]
        miss = pools.base.take(at) >= OUTSIDE
        resident = pools.base[:n] < OUTSIDE
        victims, ok = step_streams(self.state, requests, pools.count[:n], self.capacity, resident)
        if not ok:
            raise MoecacheError(f"policy {self.name}: invalid victim at token {t}")
        return StepChange(at, miss, miss.sum(axis=1), victims)

    def compiled_state(self, requests, lengths):
        """A fresh state for every stream of `requests` (EventPolicy.reset makes it)."""
        self.reset(streams=len(requests))
        return self.state


def replay(name: str, state, requests: np.ndarray, lengths: np.ndarray, capacity, width):
    """Copies [S, T] and full-before [S, T] of every stream of `requests` [S, T, k]
    (expert ids, padded past `lengths`) under the rule whose hooks are registered for
    `state`'s class (`name`, for the error), from `state`, fresh."""
    requests = np.ascontiguousarray(requests, dtype=np.int64)
    copies, full, ok = replay_streams(state, requests, lengths, capacity, width)
    if not ok:
        raise MoecacheError(f"policy {name}: invalid victim")
    return copies, full
