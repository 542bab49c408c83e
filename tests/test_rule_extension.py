"""A new eviction rule is one file (issue 49): the first example of docs/writing-a-rule.md,
saved under a new name in a module of its own and put on the policies package's path as
that page says, is in the registry, is replayed with the counts worked out by hand, and
decodes the tiny model in the harness; nothing else is edited. The registry is put back
afterwards, so no other test sees the rule."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from moecache import policies
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.policies import EventPolicy
from moecache.records.demand import from_arrays
from moecache.replay import engine

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-rule.md"
NAME, MODULE = "doc-fifo", "doc_fifo"  # the registered "fifo" keeps its name


def example() -> str:
    """The page's first Python example (a FIFO rule, EventPolicy), under NAME."""
    found = re.search(r"## Example\n.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, "docs/writing-a-rule.md: no Python example under ## Example"
    code = found.group(1)
    assert code.count('name = "fifo"') == 1, "the example names its rule once"
    return code.replace('name = "fifo"', f'name = "{NAME}"')


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """tmp_path appended to moecache.policies.__path__, as the page says for a rule kept
    outside the package; afterwards the registry, the package's path and sys.modules are
    as before."""
    before, zoo = dict(policies.POLICIES), dict(policies.ZOO)
    monkeypatch.setattr(policies, "__path__", list(policies.__path__))
    policies.__path__.append(str(tmp_path))
    try:
        yield tmp_path
    finally:
        # Put back in place: other modules hold these very dicts.
        policies.POLICIES.clear()
        policies.POLICIES.update(before)
        policies.ZOO.clear()
        policies.ZOO.update(zoo)
        for path in tmp_path.glob("*.py"):
            sys.modules.pop(f"{policies.__name__}.{path.stem}", None)
            vars(policies).pop(path.stem, None)


@pytest.fixture
def added(folder):
    """The example written to doc_fifo.py in that folder, then discover()."""
    (folder / f"{MODULE}.py").write_text(example())
    policies.discover()
    return policies.POLICIES[NAME]


def test_the_new_rule_is_registered(added):
    """It is in POLICIES under its name, its own module's, beside every rule there was;
    make builds it and replay lists it among the lossless rules it runs by default."""
    assert added.__module__ == f"moecache.policies.{MODULE}" and issubclass(added, EventPolicy)
    assert {"lru", "fifo", "farthest-future"} < set(policies.POLICIES)
    assert policies.make(NAME, 2, 4, 1, {}).name == NAME
    assert NAME in engine.lossless_rules() and NAME not in policies.ZOO


def test_the_new_rule_is_replayed(added):
    """Capacity 2, one expert per token. Stream a: 0 1 | 0 hit | 2 evicts 0, the oldest
    despite its hit | 0 evicts 1: 4 copies, 2 after the pool filled. Stream b: 3 2 | 3 hit |
    1 evicts 3 | 2 hit: 3 copies, 1 after. (LRU would copy 3 and 4.) The compiled fifo counts
    the same, and replay's report runs the rule by default."""
    demand = from_arrays(np.array([[[0], [1], [0], [2], [0]], [[3], [2], [3], [1], [2]]]), 4)
    counts = engine.run(demand, engine.make_rule(NAME, demand, 2))
    assert counts.insertions.tolist() == [4, 3]
    assert (counts.fills.tolist(), counts.steady.tolist()) == ([2, 2], [2, 1])
    fifo = engine.run(demand, engine.make_rule("fifo", demand, 2))
    assert (fifo.insertions == counts.insertions).all()
    lru = engine.run(demand, engine.make_rule("lru", demand, 2))
    assert lru.insertions.tolist() == [3, 4]
    report = engine.report(demand, 2)
    assert report["rules"][NAME]["totals"]["insertions"] == 7


def test_the_new_rule_decodes_the_tiny_model(added):
    """In the harness (plan, one stream) on the tiny random OLMoE, beside the compiled fifo:
    the same copies sequence by sequence, evictions among them, and the same NLL (both are
    lossless)."""
    from sharp_model import random_sequences, sharp_model

    from moecache.harness import decode

    layers, experts, top_k, capacity = [1, 2], 16, 4, 8
    model, sequences, names = sharp_model(), random_sequences([9, 7]), (NAME, "fifo")
    with decode.offloaded(model, layers, capacity, "cpu", 1) as off:
        factory = {n: decode.policy_factory(run_spec(n), capacity, experts, top_k) for n in names}
        arms = [off.arm(name, factory[name], capacity) for name in names]
        results = decode.decode(model, sequences, "cpu", arms, off.own, warmup_tokens=2)
    ours, fifo = results[NAME], results["fifo"]
    copies = [[(r["fills"], r["steady"]) for r in run["sequences"]] for run in (ours, fifo)]
    assert copies[0] == copies[1] and sum(steady for _, steady in copies[0]) > 0
    assert ours["totals"]["nll"] == pytest.approx(fifo["totals"]["nll"], abs=1e-6)


def test_a_name_taken_twice_is_one_line(folder):
    """A second rule under a registered name stops discovery in one line naming both
    modules, and leaves the registry as it was."""
    (folder / "second_lru.py").write_text(example().replace(f'"{NAME}"', '"lru"'))
    with pytest.raises(MoecacheError) as caught:
        policies.discover()
    message = str(caught.value)
    assert "\n" not in message and "'lru'" in message
    assert "moecache.policies.lru" in message and "moecache.policies.second_lru" in message
    assert policies.POLICIES["lru"].__module__ == "moecache.policies.lru"
