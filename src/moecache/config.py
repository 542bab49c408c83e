"""Load and check a study's configuration.

The JSON schema (workflow/schemas/config.schema.yaml) states types and allowed keys;
`check` adds the rules that relate keys to each other. Both report one line that
names the offending key, so a bad config stops before any job runs.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from moecache.errors import MoecacheError
from moecache.runs import HeadsName


class ConfigError(MoecacheError):
    """A configuration that cannot describe a valid study."""


# How the decode stage splits into jobs (harness.fan_out): one per shard, every run
# interleaved in it (the default), or one per run x multiplier x shard.
FAN_OUTS = ("shard", "run")
# The exact optimum (replay/optimum.py) holds 2^N resident sets: its sweep takes N <= this.
MAX_EXPERTS = 16


def run_multipliers(run: dict) -> list[int]:
    """A harness run's copy multipliers: its `multipliers`, by default [1] (the machine's own
    link). The one place the default is written; everything reads it here."""
    return run.get("multipliers", [1])


def run_shards(run: dict, config: dict) -> list[str]:
    """The held-out shards a harness run decodes: its `shards`, by default every held-out
    shard of `config`. The one place the default is written; everything reads it here."""
    return run.get("shards", list(config["corpus"]["heldout"]["shards"]))


def run_decodes_shard(run: dict, shard: str) -> bool:
    """Whether a harness run decodes `shard`, for a job that knows its own shard but not the
    corpus (a decode job's settings hold model and harness only): run_shards' default,
    every shard, includes it."""
    return shard in run_shards(run, {"corpus": {"heldout": {"shards": [shard]}}})


def fan_out(config: dict) -> str:
    """harness.fan_out, `shard` when left out; anything else refuses with one line."""
    mode = config["harness"].get("fan_out", FAN_OUTS[0])
    if mode not in FAN_OUTS:
        raise ConfigError(
            f"config key harness.fan_out: {mode!r} is not one of {', '.join(FAN_OUTS)}"
        )
    return mode


def schema() -> dict:
    text = resources.files("moecache").joinpath("config.schema.yaml").read_text()
    return yaml.safe_load(text)


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
    if "model" in config:
        known_family(config)


def check(config: dict) -> None:
    """Cross-field rules the schema cannot express."""
    known_family(config)  # first, as when the schema listed the families (Snakemake's path)
    arch = config["model"]["architecture"]
    harness = config["harness"]
    experts, top_k = arch["num_experts"], arch["num_experts_per_tok"]
    if top_k > experts:
        raise ConfigError(
            f"config key model.architecture.num_experts_per_tok: top-k {top_k} is larger "
            f"than num_experts {experts}"
        )
    if harness["capacity"] >= experts:
        raise ConfigError(
            f"config key harness.capacity: capacity {harness['capacity']} must be below "
            f"num_experts {experts} (at C = N nothing is offloaded)"
        )
    if top_k > harness["capacity"]:
        raise ConfigError(
            f"config key harness.capacity: top-k {top_k} is larger than capacity "
            f"{harness['capacity']}"
        )
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
    check_family(config)
    fan_out(config)
    check_runs(config)
    check_batched(config)
    check_replay(config)
    check_learned(config)
    check_router_tuning(config)
    check_controller(config)
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
    probe = {"policy": "dwell", "params": window, "where": "harness.probe"}
    for name, run in {**harness["runs"], "probe": probe}.items():
        where = f"config key {run.get('where', f'harness.runs.{name}')}"
        capacity = run.get("capacity", harness["capacity"])
        try:
            policy = policies.make(
                run["policy"],
                capacity,
                arch["num_experts"],
                arch["num_experts_per_tok"],
                run.get("params", {}),
            )
        except MoecacheError as error:
            raise ConfigError(f"{where}: {error}") from None
        for shard in run.get("shards", []):
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

    if "prefetch" in run and not run.get("overlap"):
        raise ConfigError(f"{where}.prefetch: prefetching needs overlap: true")
    if not run.get("overlap"):
        return policy.needs_future
    try:
        prefetcher = prefetch.make(run.get("prefetch", "none"), run.get("prefetch_params"))
    except MoecacheError as error:
        raise ConfigError(f"{where}.prefetch: {error}") from None
    if prefetcher.name != "none" and (policy.restricts or policy.needs_probs):
        raise ConfigError(
            f"{where}.prefetch: {prefetcher.name} needs a lossless eviction rule that ranks "
            f"without the router's probabilities, not {policy.name}"
        )
    return policy.needs_future or prefetcher.needs_trace


def check_batched(config: dict) -> None:
    """harness.batched names runs the union block can decode, on sequences that exist,
    and comes with harness.batch_sizes (and they with it)."""
    from moecache import policies

    harness = config["harness"]
    where = "config key harness.batched"
    if ("batch_sizes" in harness) != ("batched" in harness):
        raise ConfigError(f"{where}: give harness.batch_sizes and harness.batched together")
    if "batched" not in harness:
        return
    batched = harness["batched"]
    sequences = config["corpus"]["heldout"]["sequences"]
    if batched["sequences"] > sequences:
        raise ConfigError(
            f"{where}.sequences: {batched['sequences']} is more than the {sequences} "
            "sequences of a shard"
        )
    first = next(iter(config["corpus"]["heldout"]["shards"]))
    for name in batched["runs"]:
        run = harness["runs"].get(name)
        if run is None:
            raise ConfigError(f"{where}.runs: {name!r} is not a run of harness.runs")
        policy = policies.POLICIES[run["policy"]]
        if policy.needs_probs or policy.needs_hidden:
            raise ConfigError(
                f"{where}.runs: {name!r} reads the router; batched decoding runs lossless "
                "rules that do not, Dwell-k and Static"
            )
        if first not in run_shards(run, config):
            raise ConfigError(f"{where}.runs: {name!r} does not decode the first shard {first!r}")
        if run.get("overlap"):
            raise ConfigError(f"{where}.runs: {name!r} overlaps its copies (batch one only)")


def check_replay(config: dict) -> None:
    """Held-out sequences a shard has, replay capacities the model allows, and the
    shapes of check_replay_shapes."""
    replay = config["replay"]
    where = "config key replay"
    sequences = config["corpus"]["heldout"]["sequences"]
    if replay["heldout_sequences"] > sequences:
        raise ConfigError(
            f"{where}.heldout_sequences: {replay['heldout_sequences']} is more than the "
            f"{sequences} sequences of a shard"
        )
    check_replay_shapes(replay)
    arch = config["model"]["architecture"]
    for capacity in replay.get("capacities", []):
        if not arch["num_experts_per_tok"] <= capacity <= arch["num_experts"]:
            raise ConfigError(
                f"{where}.capacities: {capacity} needs top-k {arch['num_experts_per_tok']} "
                f"<= C <= num_experts {arch['num_experts']}"
            )


def check_replay_shapes(replay: dict) -> None:
    """The sweep's shapes the exact search can take; a benchmark pool that serves a token."""
    where = "config key replay"
    low, high = replay["optimum"]["tokens"]
    if low > high:
        raise ConfigError(f"{where}.optimum.tokens: min {low} is above max {high}")
    for experts, capacity, top_k in replay["optimum"]["shapes"]:
        if not top_k <= capacity <= experts <= MAX_EXPERTS:
            raise ConfigError(
                f"{where}.optimum.shapes: [{experts}, {capacity}, {top_k}] needs "
                f"k <= C <= N <= {MAX_EXPERTS}"
            )
    bench = replay["benchmark"]
    if not bench["top_k"] <= bench["capacity"] <= bench["experts"]:
        raise ConfigError(f"{where}.benchmark: need top_k <= capacity <= experts")
    if bench["mean_tokens"] > bench["max_tokens"]:
        raise ConfigError(f"{where}.benchmark.mean_tokens: above max_tokens")


def family(config: dict) -> str:
    """The model family (transformers' model_type), olmoe unless the config names one."""
    return config["model"].get("family", "olmoe")


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


def embedded(config: dict) -> bool:
    return config["model"]["source"] == "embedded"


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


def check_learned(config: dict) -> None:
    """Enough sequences to fit and validate on, and closed-loop scorers the stage trains."""
    from moecache.records import scorer_groups as groups

    learned = config.get("learned")
    if learned is None:
        return
    where = "config key learned"
    corpus = config["corpus"]
    if "trace_sequences" not in corpus:
        raise ConfigError("config key corpus.trace_sequences: required by section learned")
    fit = corpus["heldout"]["sequences"] - config["replay"]["heldout_sequences"]
    validation = learned["validation_sequences"]
    if validation["shard"] >= fit:
        raise ConfigError(
            f"{where}.validation_sequences.shard: {validation['shard']} leaves none of a "
            f"shard's {fit} training sequences to fit on"
        )
    if validation["trace"] >= corpus["trace_sequences"]:
        raise ConfigError(
            f"{where}.validation_sequences.trace: {validation['trace']} leaves none of the "
            f"{corpus['trace_sequences']} trace sequences to fit on"
        )
    for name in learned["closed_loop"]:
        group, kind = name.split("/")
        if kind not in groups.trained_kinds(learned, group):
            raise ConfigError(f"{where}.closed_loop: {name}: that group trains no {kind}")
        if group.startswith("past-use-") and group[9:] not in corpus["heldout"]["shards"]:
            raise ConfigError(f"{where}.closed_loop: {name}: no held-out shard {group[9:]!r}")


def controller_heads(controller: dict) -> list[str]:
    """The heads files a controller section trains: objective x seed, then the first
    objective and seed at each price."""
    names = [HeadsName(o, s) for o in controller["objectives"] for s in controller["seeds"]]
    first = names[0]
    names += [HeadsName(first.objective, first.seed, e) for e in controller["prices"]]
    return [f"results/controller/heads/{name}.safetensors" for name in names]


def check_controller(config: dict) -> None:
    """Controller runs name heads the section trains; the compared runs restrict; the
    longer sequences fit the model."""
    controller, harness = config.get("controller"), config["harness"]
    trained = controller_heads(controller) if controller else []
    for name, run in harness["runs"].items():
        if run["policy"] != "controller":
            continue
        weights = str(run.get("params", {}).get("weights", ""))
        if weights.startswith("results/controller/heads/") and weights not in trained:
            raise ConfigError(
                f"config key harness.runs.{name}.params.weights: {weights} is not a heads "
                "file the controller section trains"
                + ("" if controller else " (the config has no controller section)")
            )
    if controller is None:
        return
    where = "config key controller"
    if config["corpus"]["source"] != "python-docs" and "trace_sequences" not in config["corpus"]:
        raise ConfigError("config key corpus.trace_sequences: required by section controller")
    for name in [*controller["compare"], *controller["longer"].get("compare", [])]:
        run = harness["runs"].get(name)
        if run is None or run["policy"] not in ("dwell", "static"):
            raise ConfigError(
                f"{where}.compare: {name} is not a dwell or static run of harness.runs"
            )
    if harness["capacity"] >= config["model"]["architecture"]["num_experts"]:
        raise ConfigError(f"{where}: harness.capacity must be below num_experts to restrict")
    longest = config["model"]["architecture"]["max_position_embeddings"]
    if controller["longer"]["tokens"] > longest:
        raise ConfigError(
            f"{where}.longer.tokens: {controller['longer']['tokens']} exceeds "
            f"max_position_embeddings {longest}"
        )


def check_router_tuning(config: dict) -> None:
    """The simulated layer is measured, the cache sizes fit the model, the prompts fit."""
    tuning = config.get("router_tuning")
    if tuning is None:
        return
    where = "config key router_tuning"
    arch, harness = config["model"]["architecture"], config["harness"]
    if tuning["source"] == "embedded" and not embedded(config):
        raise ConfigError(f"{where}.source: embedded needs model.source embedded")
    if not embedded(config) and "trace_sequences" not in config["corpus"]:
        raise ConfigError("config key corpus.trace_sequences: router_tuning prompts need it")
    if tuning["layer"] not in harness["restricted_layers"]:
        raise ConfigError(
            f"{where}.layer: {tuning['layer']} is not one of harness.restricted_layers "
            f"{harness['restricted_layers']} (its copies are measured there)"
        )
    top_k, experts = arch["num_experts_per_tok"], arch["num_experts"]
    for key, sizes in (("capacity", [tuning["capacity"]]), ("cache_sizes", tuning["cache_sizes"])):
        for size in sizes:
            if not top_k <= size <= experts:
                raise ConfigError(
                    f"{where}.{key}: {size} outside top-k {top_k} .. num_experts {experts}"
                )
    longest = tuning["prompt_tokens"] + tuning["completion_tokens"] + 16  # 16: the tag
    if longest > arch["max_position_embeddings"]:
        raise ConfigError(
            f"{where}.prompt_tokens: with completion_tokens, {longest} exceeds "
            f"max_position_embeddings {arch['max_position_embeddings']}"
        )
    if tuning["measure_sequences"] > config["corpus"]["heldout"]["sequences"]:
        raise ConfigError(f"{where}.measure_sequences: more than a shard's sequences")
    if tuning["generation_prompts"] > tuning["measure_sequences"]:
        raise ConfigError(f"{where}.generation_prompts: more than measure_sequences")
    if tuning["eval_prompts"] > tuning["prompts"]:
        raise ConfigError(f"{where}.eval_prompts: more than prompts")
