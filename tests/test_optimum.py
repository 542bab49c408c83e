"""moecache.replay.optimum: the exact fewest insertions against brute force, Belady, LRU and a hand
example; its error messages; and the random demand streams."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies import belady_reference

from moecache.config.keys import MAX_EXPERTS
from moecache.errors import MoecacheError
from moecache.replay.optimum import KINDS, exact_insertions, generate


def popcount(x):
    return np.bitwise_count(np.asarray(x, dtype=np.int64))


def brute_force(stream, n, c):
    """The cheapest lossless schedule by trying every sequence of resident sets R_1..R_T
    (each any subset of the experts with |R_t| <= C that holds S_t), prefetching included."""
    options = []
    for token in stream:
        need = sum(1 << int(e) for e in set(token))
        options.append([r for r in range(1 << n) if r & need == need and popcount(r) <= c])
    best = None
    for schedule in itertools.product(*options):
        previous, cost = 0, 0
        for r in schedule:
            cost += int(popcount(r & ~previous))
            previous = r
        best = cost if best is None else min(best, cost)
    return 0 if best is None else best


def lru_insertions(stream, c):
    """On-demand LRU: a miss inserts the expert, evicting the least recently used one that
    the current token does not need."""
    cache: list[int] = []  # least recently used first
    misses = 0
    for token in stream:
        token = [int(e) for e in token]
        for e in token:
            if e in cache:
                cache.remove(e)
            else:
                misses += 1
                if len(cache) == c:
                    victim = next(x for x in cache if x not in token)
                    cache.remove(victim)
            cache.append(e)
    return misses


@st.composite
def tiny_instance(draw):
    n = draw(st.integers(1, 5))
    k = draw(st.integers(1, n))
    c = draw(st.integers(k, n))
    t = draw(st.integers(0, 4))
    perm = st.permutations(range(n)).map(lambda p: list(p[:k]))
    stream = draw(st.lists(perm, min_size=t, max_size=t))
    return np.array(stream, dtype=np.int64).reshape(t, k), n, c


@settings(max_examples=300, deadline=None)
@given(tiny_instance())
def test_matches_brute_force(instance):
    stream, n, c = instance
    assert exact_insertions(stream[None], n, c).tolist() == [brute_force(stream, n, c)]


def test_matches_brute_force_batched():
    """Many instances of one shape at once, so the batch axis and blocking are covered."""
    rng = np.random.default_rng(7)
    for n, c, k, t in [(4, 2, 1, 4), (5, 3, 2, 4), (5, 5, 2, 3), (4, 3, 3, 4)]:
        streams = np.concatenate([generate(rng, kind, 20, t, n, k) for kind in KINDS])
        got = exact_insertions(streams, n, c)
        assert got.dtype == np.int64 and got.shape == (len(streams),)
        assert got.tolist() == [brute_force(s, n, c) for s in streams]


def test_blocks_agree(monkeypatch):
    """Solving in blocks of instances gives the same answers as one block."""
    from moecache.replay import optimum

    streams = generate(np.random.default_rng(3), "bursty", 50, 12, 8, 2)
    whole = exact_insertions(streams, 8, 4)
    monkeypatch.setattr(optimum, "_BLOCK_STATES", 7 * 256)  # 7 instances per block
    assert exact_insertions(streams, 8, 4).tolist() == whole.tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_between_distinct_and_lru(kind):
    rng = np.random.default_rng(11)
    for n, c, k, t in [(8, 3, 2, 20), (10, 5, 2, 16), (12, 8, 4, 12)]:
        streams = generate(rng, kind, 40, t, n, k)
        got = exact_insertions(streams, n, c)
        for s, opt in zip(streams, got, strict=True):
            assert len(np.unique(s)) <= opt <= lru_insertions(s, c)


def test_equals_belady_for_one_expert_per_token():
    rng = np.random.default_rng(5)
    for n, c in [(6, 2), (8, 3), (10, 4), (10, 9)]:
        streams = np.concatenate([generate(rng, kind, 30, 20, n, 1) for kind in KINDS])
        got = exact_insertions(streams, n, c)
        assert got.tolist() == [belady_reference([int(t[0]) for t in s], c) for s in streams]


def test_all_resident_costs_distinct_experts():
    """With C = N nothing need ever leave: the optimum is the number of distinct experts."""
    streams = generate(np.random.default_rng(2), "zipf", 30, 16, 7, 3)
    got = exact_insertions(streams, 7, 7)
    assert got.tolist() == [len(np.unique(s)) for s in streams]


def test_hand_example_cycle():
    # N=3, C=2, k=1, stream A B C A B C ... (A=0, B=1, C=2). Prefetching never saves an
    # insertion when k=1 (delay each insertion to the token that needs it), so Belady's MIN
    # is optimal. By hand for A B C A B C A B C:
    #   A miss {A}; B miss {A,B}; C miss, evict B (A comes back first) {A,C}; A hit;
    #   B miss, evict A (C comes first) {B,C}; C hit; A miss, evict C {A,B}; B hit; C miss.
    # After the two cold misses every second token misses: 2 + ceil((T - 2) / 2) for T >= 2,
    # so T=6 costs 4 and T=9 costs 6. LRU would miss on every token (T).
    for t, expected in [(1, 1), (2, 2), (3, 3), (4, 3), (6, 4), (9, 6), (12, 7)]:
        stream = (np.arange(t) % 3).reshape(1, t, 1)
        assert exact_insertions(stream, 3, 2).tolist() == [expected]
        assert expected == 1 if t == 1 else 2 + -(-(t - 2) // 2)


def test_empty_inputs():
    assert exact_insertions(np.zeros((0, 5, 2), dtype=int), 4, 2).tolist() == []
    assert exact_insertions(np.zeros((3, 0, 2), dtype=int), 4, 2).tolist() == [0, 0, 0]


def test_sixteen_experts_supported():
    assert MAX_EXPERTS == 16
    stream = np.array([[[0, 15]], [[3, 7]]])
    assert exact_insertions(stream, 16, 2).tolist() == [2, 2]


@pytest.mark.parametrize(
    ("requests", "n", "c", "words"),
    [
        (np.zeros((1, 2, 2), dtype=int), 17, 4, "at most 16 supported, got 17"),
        (np.zeros((1, 2, 2), dtype=int), 64, 4, "2^N resident sets; at most 16 supported, got 64"),
        (np.zeros((1, 2, 3), dtype=int), 8, 2, "capacity"),
        (np.zeros((1, 2, 3), dtype=int), 8, 9, "capacity"),
        (np.full((1, 2, 2), 8), 8, 4, "expert id 8 out of range"),
        (np.full((1, 2, 2), -1), 8, 4, "expert id -1 out of range"),
        (np.zeros((2, 2), dtype=int), 8, 4, "shape"),
        (np.zeros((1, 2, 2)), 8, 4, "integers"),
    ],
)
def test_errors_are_one_line(requests, n, c, words):
    with pytest.raises(MoecacheError) as info:
        exact_insertions(requests, n, c)
    message = str(info.value)
    assert words in message and "\n" not in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "k"), [(8, 2), (16, 4), (64, 8), (3, 3), (5, 1)])
def test_generate_shape_and_ids(kind, n, k):
    streams = generate(np.random.default_rng(0), kind, 50, 24, n, k)
    assert streams.shape == (50, 24, k) and streams.dtype == np.int64
    assert streams.min() >= 0 and streams.max() < n
    assert (np.diff(np.sort(streams, axis=-1), axis=-1) > 0).all()  # distinct in each token
    again = generate(np.random.default_rng(0), kind, 50, 24, n, k)
    assert (streams == again).all()
    other = generate(np.random.default_rng(1), kind, 50, 24, n, k)
    assert k == n or (streams != other).any()


def reuse(streams):
    """The mean number of a token's experts that the previous token also used."""
    same = streams[:, 1:, :, None] == streams[:, :-1, None, :]
    return same.any(axis=-1).sum(axis=-1).mean()


def test_bursty_reuses_more_than_uniform():
    rng = np.random.default_rng(4)
    n, k = 16, 4
    uniform = reuse(generate(rng, "uniform", 200, 24, n, k))
    bursty = reuse(generate(rng, "bursty", 200, 24, n, k))
    assert uniform == pytest.approx(k * k / n, rel=0.1)
    assert bursty == pytest.approx(k * 0.75, rel=0.1)  # p drawn from [0.6, 0.9]
    assert bursty > 2 * uniform


def test_zipf_is_skewed():
    """Each zipf instance leans on a few experts far more than uniform does."""
    rng = np.random.default_rng(6)

    def top_share(streams, n):
        counts = np.stack([np.bincount(s.ravel(), minlength=n) for s in streams])
        return (np.sort(counts, axis=1)[:, -2:].sum(axis=1) / counts.sum(axis=1)).mean()

    assert top_share(generate(rng, "zipf", 100, 200, 16, 1), 16) > 0.4
    assert top_share(generate(rng, "uniform", 100, 200, 16, 1), 16) < 0.25


def test_generate_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(MoecacheError, match="unknown stream kind 'gauss'"):
        generate(rng, "gauss", 2, 3, 8, 2)
    with pytest.raises(MoecacheError, match="streams: top-k 5 is larger than experts 4"):
        generate(rng, "uniform", 2, 3, 4, 5)
