"""Every default a study's settings have is stated once, as `default:` in the schema, and
filled in when a config loads (src/moecache/config/defaults.py); no stage writes one."""

import ast
import copy
import pathlib

import yaml

from moecache import config as configs

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "moecache"
SMOKE = ROOT / "config" / "smoke.yaml"
# The readers of results files: their records' fields are the record classes', and a run
# that predates a field is read with the field's old meaning there.
RECORD_READERS = ("config", "report", "costs")
# The GPU check's own report (a record) has an `overlap` section too.
RECORDS_ELSEWHERE = {("harness/gpu_check.py", "overlap"), ("harness/paper_check.py", "overlap")}


def defaulted_keys(node, found=None) -> set[str]:
    """Every key of the schema that has a `default:`."""
    found = set() if found is None else found
    if isinstance(node, dict):
        for key, rule in node.get("properties", {}).items():
            if isinstance(rule, dict) and "default" in rule:
                found.add(key)
        for value in node.values():
            defaulted_keys(value, found)
    elif isinstance(node, list):
        for value in node:
            defaulted_keys(value, found)
    return found


def fallback_reads(path: pathlib.Path, keys: set[str]) -> list[str]:
    """`x.get("key", fallback)` calls of `path` on a key the schema gives a default."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in keys
            and (path.relative_to(PACKAGE).as_posix(), node.args[0].value) not in RECORDS_ELSEWHERE
        ):
            found.append(
                f"{path.relative_to(ROOT)}:{node.lineno} .get({node.args[0].value!r}, ...)"
            )
    return found


def test_no_stage_writes_a_default_of_its_own():
    keys = defaulted_keys(configs.schema())
    assert {"gate_repeats", "params", "multipliers", "slow_link", "family"} <= keys
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in RECORD_READERS
        for line in fallback_reads(path, keys)
    ]
    assert not found, "\n".join(found)


def test_the_schema_states_no_default_in_prose():
    text = configs.schema_text()
    assert "(default" not in text and "Default:" not in text


def test_a_key_left_out_loads_as_the_schema_default(tmp_path):
    settings = yaml.safe_load(SMOKE.read_text())
    for key in ("gate_repeats", "slow_link", "link_check_tokens"):
        settings["harness"].pop(key, None)
    settings["model"].pop("family", None)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    loaded = configs.load(path)
    assert loaded["harness"]["gate_repeats"] == configs.schema_default("harness", "gate_repeats")
    assert loaded["harness"]["slow_link"] == "auto"
    assert loaded["harness"]["link_check_tokens"] == 96
    assert loaded["model"]["family"] == "olmoe"
    run = next(iter(loaded["harness"]["runs"].values()))
    assert {"params", "multipliers", "overlap", "prefetch", "prefetch_params"} <= set(run)


def test_each_run_gets_a_default_of_its_own():
    """Snakemake's validate() would hand every run the same `params` object."""
    settings = configs.fill_defaults(yaml.safe_load(SMOKE.read_text()))
    runs = [run for run in settings["harness"]["runs"].values() if "params" in run]
    assert len({id(run["params"]) for run in runs}) == len(runs)
    assert len({id(run["multipliers"]) for run in runs}) == len(runs)


def test_a_section_left_out_stays_out():
    settings = yaml.safe_load(SMOKE.read_text())
    settings["harness"].pop("tiers", None)
    filled = configs.fill_defaults(copy.deepcopy(settings))
    assert "tiers" not in filled["harness"]
    assert filled["harness"]["gate_repeats"] == settings["harness"].get("gate_repeats", 3)


def test_a_run_the_code_decodes_reads_as_a_config_run():
    spec = configs.run_spec("dwell", {"k": 2, "window": 2})
    assert spec == {
        "policy": "dwell",
        "params": {"k": 2, "window": 2},
        "multipliers": [1],
        "overlap": False,
        "prefetch": "none",
        "prefetch_params": {},
    }
