"""The card configs (config/cards/): each of today's paper-scale models on a 24, 48 or 80
GiB card with every MoE layer offloaded validates, holds the C that `moecache plan --jobs`
picks for its card (the study's jobs fit it less the plan's reserve, C + 1 would not, unless
C is N - 1, the most a config holds), and builds its DAG; docs/plan.md's card table is what
`moecache plan-table --jobs` prints."""

from __future__ import annotations

import copy
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, moecache, snakemake

from moecache import config as configs
from moecache.plan import RESERVE_GIB, cards, fit
from moecache.schedule import accountant

GIB = 2**30
CARDS = sorted((REPO / "config" / "cards").glob("*.yaml"))
# (today's config, card GiB) per card config; Mixtral-8x7B has none at 24 GiB (one run at
# C = top_k needs more: docs/plan.md's card table says so).
EXPECTED = {
    f"{model}-{gib}gib.yaml": (f"{model}.yaml", gib)
    for model in ("qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b")
    for gib in (24, 48, 80)
    if (model, gib) != ("mixtral-8x7b", 24)
}


def test_each_model_has_a_config_for_each_card_it_fits():
    assert {path.name for path in CARDS} == set(EXPECTED)


@pytest.fixture(scope="module")
def picked() -> dict:
    """What `moecache plan --jobs` picks for each card config on its card."""

    def pick(path):
        settings = configs.load(path)
        return settings, fit.largest_capacity(
            settings, settings["harness"]["device_gib"], figure="jobs"
        )

    return {path.name: pick(path) for path in CARDS}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_card_config_holds_the_c_its_jobs_fit(name, picked):
    settings, found = picked[name]
    today, gib = EXPECTED[name]
    base = configs.load(REPO / "config" / today)
    assert settings["model"] == base["model"]
    harness = settings["harness"]
    assert harness["device_gib"] == gib
    # Every MoE layer offloaded.
    sizes = fit.sizes(settings)
    assert harness["restricted_layers"] == list(sizes.moe_layers)
    # Its C is the command's pick, and its own jobs' peak (plan, as the harness sizes it)
    # fits the card less the reserve (the CUDA context and the allocator: docs/plan.md).
    left = (gib - RESERVE_GIB) * GIB
    chosen, nxt = found["chosen"], found["next"]
    capacity = harness["capacity"]
    assert capacity == chosen["capacity"]
    own = accountant.account(settings, gib)
    assert own["fits"] and own["device_peak_bytes"] == chosen["device_peak_bytes"] <= left
    assert settings["replay"]["capacities"] == [capacity]
    # C + 1 would not fit, unless C is the most a config holds.
    if capacity == sizes.num_experts - 1:
        assert nxt is None
    else:
        assert nxt["capacity"] == capacity + 1 and nxt["device_peak_bytes"] > left
    # Today's runs, at 1x only where its scaled runs would cut C (or fit at no C).
    if settings["harness"]["runs"] == base["harness"]["runs"]:
        return
    assert cards.scaled_multipliers(settings) == "none"
    assert settings["controller"]["multipliers"] == [1] if "controller" in settings else True
    today_runs = copy.deepcopy(settings)
    today_runs["harness"]["runs"] = base["harness"]["runs"]
    try:
        with_scaled = fit.largest_capacity(today_runs, gib, figure="jobs")
    except fit.TooSmall:
        return
    assert with_scaled["chosen"]["capacity"] < capacity


def test_plan_jobs_prints_the_card_and_its_jobs(tmp_path):
    """`moecache plan --jobs` on a card config plans on its harness.device_gib."""
    path = REPO / "config" / "cards" / "qwen3-30b-a3b-24gib.yaml"
    result = moecache("plan", "--jobs", "--configfile", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    capacity = configs.load(path)["harness"]["capacity"]
    assert lines[0].startswith("fit: Qwen/Qwen3-30B-A3B (qwen3_moe, bfloat16) on a 24 GiB GPU")
    assert lines[1].startswith(f"  C = {capacity} experts per layer")
    assert "for the study's jobs (gates " in lines[2] and "reference left out" in lines[2]
    assert f"(C = {capacity + 1} would need " in lines[2]
    bare = moecache("plan", "--jobs", "--configfile", str(REPO / "config" / "qwen3-30b-a3b.yaml"))
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.strip() == (
        "moecache: error: --jobs: give --gpu-gib G, the GPU it plans for (or harness.device_gib)"
    )
    sizes = moecache("plan-table", "--configfile", str(path))
    assert sizes.returncode == 2 and sizes.stdout == ""
    assert sizes.stderr.strip() == (
        "moecache: error: --gpu-gib: give the GPU sizes (or --jobs, each config's card)"
    )


def test_a_card_too_small_for_one_run_is_one_row():
    """Mixtral-8x7B at 24 GiB: even one run at C = top_k needs more than the card."""
    mixtral = configs.load(REPO / "config" / "mixtral-8x7b.yaml")
    with pytest.raises(fit.TooSmall) as small:
        fit.largest_capacity(mixtral, 24, figure="jobs")
    assert fit.device_peak(small.value.smallest) > (24 - RESERVE_GIB) * GIB
    assert cards.none_fits(small.value.smallest, 24).startswith("none (one run at C = 2 needs ")


def test_the_docs_card_table_is_what_plan_table_jobs_prints():
    doc = (REPO / "docs" / "plan.md").read_text()
    command = re.search(r"```sh\n(moecache plan-table --jobs [^`]*?)\n```", doc)[1]
    words = command.replace("\\\n", " ").split()
    given = words[words.index("--configfile") + 1 : words.index("--gpu-gib")]
    gibs = [float(g) for g in words[words.index("--gpu-gib") + 1 :]]
    paths = [p for word in given for p in sorted(REPO.glob(word))]
    assert paths[: len(CARDS)] == CARDS and gibs == [24]
    table = cards.cards_table(paths, gibs)
    assert table in doc, "docs/plan.md: regenerate its card table with the command above it"


@pytest.mark.pipeline
def test_the_card_configs_build_their_dag(tmp_path):
    """`snakemake all -n` on each card config, side by side."""

    def dry_run(path):
        workdir = tmp_path / path.stem
        workdir.mkdir()
        return snakemake(workdir, "all", "-n", configfile=path, check=False)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(dry_run, CARDS))
    for path, result in zip(CARDS, results, strict=True):
        assert result.returncode == 0, f"{path.name}:\n{result.stdout}\n{result.stderr}"
        table = result.stdout.split("Job stats:")[1].split("total")[0]
        jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}
        settings = configs.load(path)
        # Both shards decoded, one job each; the router tuning only where its card holds it.
        assert jobs["decode"] == 2 and "train" not in jobs, path.name
        assert ("router_train" in jobs) == ("router_tuning" in settings), path.name
