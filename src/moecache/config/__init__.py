"""Load and check a study's configuration.

The JSON schema (workflow/schemas/config.schema.yaml) states types and allowed keys;
`check` adds the rules that relate keys to each other. Both report one line that
names the offending key, so a bad config stops before any job runs.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from moecache.config import defaults
from moecache.config.keys import (
    ConfigError,
    capacity_of,
    embedded,
    family,
    fan_out,
    run_multipliers,
    run_shards,
)
from moecache.config.stages import (
    check_batched,
    check_controller,
    check_learned,
    check_replay,
    check_replay_shapes,
    check_router_tuning,
)
from moecache.errors import MoecacheError
from moecache.records.shape import check_shape


@functools.cache
def schema_text() -> str:
    return resources.files("moecache").joinpath("config.schema.yaml").read_text()


@functools.cache
def parsed_schema() -> dict:
    """The schema, parsed once (about 70 ms a parse here): read it, never change it; schema()
    is a copy to change."""
    return yaml.safe_load(schema_text())


def schema() -> dict:
    return copy.deepcopy(parsed_schema())


def schema_default(*path: str):
    """The schema's default of the key at `path` (e.g. "harness", "gate_repeats"), for a
    caller that builds settings of its own (the GPU check's harness)."""
    return defaults.section_schema(parsed_schema(), path)["default"]


def fill_defaults(config: dict) -> dict:
    """`config` with every default of the schema filled in, in place: each default object
    a copy of its own (Snakemake's `validate` would share one between runs)."""
    return defaults.fill(config, parsed_schema())


def with_defaults(section: dict, *path: str) -> dict:
    """A copy of the config section at `path` (e.g. "harness") with its defaults filled, for
    a caller holding a section, not a whole config (tests, the GPU check)."""
    section = copy.deepcopy(section)
    return defaults.fill(section, defaults.section_schema(parsed_schema(), path))


def run_spec(policy: str, params: dict | None = None, **keys) -> dict:
    """A harness run the code decodes itself (the gates', the probe's, a stage's rows), as a
    config's run reads once loaded: every default of harness.runs filled in."""
    return with_defaults({"policy": policy, "params": params or {}, **keys}, "harness", "runs", "*")


def key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def describe(error: jsonschema.ValidationError) -> str:
    """One line naming the key of a schema violation."""
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - allowed)
        where = (
            key_path([*error.absolute_path, unknown[0]])
            if unknown
            else key_path(error.absolute_path)
        )
        return f"config key {where}: unknown key (allowed: {', '.join(sorted(allowed))})"
    return f"config key {key_path(error.absolute_path)}: {error.message}"


def validate_schema(config: dict, required: tuple[str, ...] | None = None) -> None:
    """Check `config` against the schema; `required` narrows the top-level keys that must
    be present, for stages that receive only the sections they read."""
    rules = schema()
    if required is not None:
        rules["required"] = list(required)
    validator = jsonschema.Draft202012Validator(rules)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path)))
    if errors:
        raise ConfigError(describe(jsonschema.exceptions.best_match(errors)))
    fill_defaults(config)
    if "model" in config:
        known_family(config)


def check(config: dict) -> None:
    """Cross-field rules the schema cannot express."""
    known_family(config)  # first, as when the schema listed the families (Snakemake's path)
    check_sizes(config)
    check_family(config)
    fan_out(config)
    check_runs(config)
    check_batched(config)
    check_replay(config)
    check_learned(config)
    check_router_tuning(config)
    check_controller(config)
    check_corpus(config)


def check_sizes(config: dict) -> None:
    """The model's sizes, its capacity and its restricted layers agree."""
    arch = config["model"]["architecture"]
    harness = config["harness"]
    experts, top_k = arch["num_experts"], arch["num_experts_per_tok"]
    where = "config key model.architecture.num_experts_per_tok"
    check_shape(top_k, None, experts, where=where, error=ConfigError)
    if harness["capacity"] >= experts:
        raise ConfigError(
            f"config key harness.capacity: capacity {harness['capacity']} must be below "
            f"num_experts {experts} (at C = N nothing is offloaded)"
        )
    check_shape(top_k, harness["capacity"], where="config key harness.capacity", error=ConfigError)
    layers = arch["num_hidden_layers"]
    for layer in harness["restricted_layers"]:
        if layer >= layers:
            raise ConfigError(
                f"config key harness.restricted_layers: layer {layer} does not exist "
                f"(the model has layers 0..{layers - 1})"
            )
    if arch["hidden_size"] % arch["num_attention_heads"]:
        raise ConfigError(
            "config key model.architecture.num_attention_heads: must divide hidden_size "
            f"{arch['hidden_size']}"
        )


def check_corpus(config: dict) -> None:
    """The held-out shards fit the model and do not overlap; the embedded model's sections."""
    arch = config["model"]["architecture"]
    heldout = config["corpus"]["heldout"]
    if heldout["max_tokens"] > arch["max_position_embeddings"]:
        raise ConfigError(
            f"config key corpus.heldout.max_tokens: {heldout['max_tokens']} exceeds "
            f"max_position_embeddings {arch['max_position_embeddings']}"
        )
    offsets = sorted(heldout["shards"].items(), key=lambda item: item[1])
    for (first, start), (second, next_start) in zip(offsets, offsets[1:], strict=False):
        if next_start < start + heldout["sequences"]:
            raise ConfigError(
                f"config key corpus.heldout.shards.{second}: offset {next_start} overlaps "
                f"shard {first} ({start}..{start + heldout['sequences'] - 1})"
            )
    if config["corpus"]["source"] == "hub" and "hub" not in config["corpus"]:
        raise ConfigError("config key corpus.hub: required when corpus.source is hub")
    if embedded(config):
        for section in ("tokenizer", "training"):
            if section not in config:
                raise ConfigError(f"config key {section}: required for the embedded model")
        if config["corpus"]["source"] != "python-docs":
            raise ConfigError("config key corpus.source: the embedded model trains on python-docs")
        seq_len = config["training"]["seq_len"]
        if seq_len > arch["max_position_embeddings"]:
            raise ConfigError(
                f"config key training.seq_len: {seq_len} exceeds max_position_embeddings "
                f"{arch['max_position_embeddings']}"
            )


def check_runs(config: dict) -> None:
    """Every decode run names a known policy with valid parameters and real shards."""
    from moecache import policies

    arch, harness = config["model"]["architecture"], config["harness"]
    shards = config["corpus"]["heldout"]["shards"]
    first = next(iter(shards))
    trace = harness["runs"].get(harness["trace_run"])
    if trace is None:
        raise ConfigError(
            f"config key harness.trace_run: {harness['trace_run']!r} is not a run "
            f"(runs: {', '.join(harness['runs'])})"
        )
    if policies.POLICIES.get(trace["policy"], policies.Policy).restricts:
        raise ConfigError(
            f"config key harness.trace_run: {harness['trace_run']!r} restricts routing; the "
            "replay and the farthest-future runs need a lossless run's demand"
        )
    if not any(first in run_shards(run, config) for run in harness["runs"].values()):
        raise ConfigError(
            f"config key harness.runs: no run decodes the first shard {first!r}, which "
            "Table 1 and Figure 1 read"
        )
    # The layer probe decodes with Dwell-k at its own k and window.
    window = {key: harness["probe"][key] for key in ("k", "window")}
    probe = run_spec("dwell", window)
    probe["where"] = "harness.probe"
    for name, run in {**harness["runs"], "probe": probe}.items():
        where = f"config key {run.get('where', f'harness.runs.{name}')}"
        try:
            policy = policies.make(
                run["policy"],
                capacity_of(harness, run),
                arch["num_experts"],
                arch["num_experts_per_tok"],
                run["params"],
            )
        except MoecacheError as error:
            raise ConfigError(f"{where}: {error}") from None
        for shard in run_shards(run, config):
            if shard not in shards:
                raise ConfigError(f"{where}.shards: no held-out shard {shard!r}")
        scaled = [m for m in run_multipliers(run) if m > 1]
        if scaled and first not in run_shards(run, config):
            raise ConfigError(
                f"{where}.multipliers: copy multipliers above 1 run on the first shard "
                f"{first!r}, which this run does not decode"
            )
        if needs_trace(policy, run, where):
            if not set(run_shards(run, config)) <= set(run_shards(trace, config)):
                raise ConfigError(f"{where}.shards: {harness['trace_run']} has no trace there")


def needs_trace(policy, run: dict, where: str) -> bool:
    """Whether `run` reads the trace run's demand (farthest-future, a trace prefetcher);
    a prefetch without overlap, or an unknown prefetcher, refuses with one line."""
    from moecache import prefetch

    if not run["overlap"]:
        if run["prefetch"] != "none":
            raise ConfigError(f"{where}.prefetch: prefetching needs overlap: true")
        return policy.needs_future
    try:
        prefetcher = prefetch.make(run["prefetch"], run["prefetch_params"])
    except MoecacheError as error:
        raise ConfigError(f"{where}.prefetch: {error}") from None
    if prefetcher.name != "none" and (policy.restricts or policy.needs_probs):
        raise ConfigError(
            f"{where}.prefetch: {prefetcher.name} needs a lossless eviction rule that ranks "
            f"without the router's probabilities, not {policy.name}"
        )
    return policy.needs_future or prefetcher.needs_trace


def known_family(config: dict) -> None:
    """The family has an adapter: the registry finds them (model/registry.py), so the
    schema keeps no list of its own to fall behind."""
    from moecache.model import registry

    name = family(config)
    if name not in registry.ADAPTERS:
        raise ConfigError(
            f"config key model.family: {name!r} has no adapter; families with one: "
            + ", ".join(sorted(registry.ADAPTERS))
        )


def check_family(config: dict) -> None:
    """The embedded model is an OLMoE; a family runs only the stages its adapter supports."""
    from moecache.model import registry

    name = family(config)
    if embedded(config) and name != "olmoe":
        raise ConfigError("config key model.family: the embedded model is an olmoe")
    adapter = registry.adapter_for(name)
    controller = "controller" in config or any(
        run["policy"] == "controller" for run in config["harness"]["runs"].values()
    )
    for stage, configured in (
        ("controller", controller),
        ("router_tuning", "router_tuning" in config),
    ):
        reason = adapter.unsupported(stage)
        if configured and reason:
            raise ConfigError(f"config key {stage}: the {name} family cannot run it: {reason}")


# A study from a routing trace alone (config/trace.yaml): what its config holds.
TRACE_STUDY = ("seed", "trace", "capacity", "replay")


def trace_only(config: dict) -> bool:
    """Whether the config studies a trace alone (`trace: PATH`, no model)."""
    return "trace" in config


def check_trace_study(config: dict) -> None:
    """Sweep and benchmark shapes that can run; no second copy of the capacity."""
    check_replay_shapes(config["replay"])
    for capacity in config["replay"].get("capacities", []):
        if capacity == config["capacity"]:
            raise ConfigError(
                f"config key replay.capacities: {capacity} is the study's capacity already"
            )


def validate(config: dict) -> dict:
    if trace_only(config):
        for key in config:  # before the schema, which would ask for the key's own keys
            if key not in (*TRACE_STUDY, "hub_offline"):
                raise ConfigError(
                    f"config key {key}: a study from a trace alone (key trace) holds only "
                    f"{', '.join(TRACE_STUDY)}"
                )
        validate_schema(config, TRACE_STUDY)
        check_trace_study(config)
        return config
    validate_schema(config)
    if "capacity" in config:
        raise ConfigError(
            "config key capacity: only a trace study (key trace) has it; the harness's "
            "pool is harness.capacity"
        )
    check(config)
    return config


def load(path: str | Path) -> dict:
    """Read a YAML config file and validate it; errors name the file and the key."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise ConfigError(f"config file {path}: not valid YAML ({reason})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path}: must be a mapping of keys")
    return validate(config)
