"""The rules of the later stages' sections, beside the core's (config/__init__.py `check`):
batched decoding, the replay study, the learned rule, the tuned routers and the
controller; each reports one line naming the offending key."""

from __future__ import annotations

from moecache.config.keys import MAX_EXPERTS, ConfigError, embedded, run_shards
from moecache.records.shape import check_shape
from moecache.runs import HeadsName


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
        if run["overlap"]:
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
    top_k, experts = arch["num_experts_per_tok"], arch["num_experts"]
    for capacity in replay.get("capacities", []):
        check_shape(top_k, capacity, experts, where=f"{where}.capacities", error=ConfigError)


def check_replay_shapes(replay: dict) -> None:
    """The sweep's shapes the exact search can take; a benchmark pool that serves a token."""
    where = "config key replay"
    low, high = replay["optimum"]["tokens"]
    if low > high:
        raise ConfigError(f"{where}.optimum.tokens: min {low} is above max {high}")
    for experts, capacity, top_k in replay["optimum"]["shapes"]:
        at = f"{where}.optimum.shapes: [{experts}, {capacity}, {top_k}]"
        check_shape(top_k, capacity, experts, where=at, error=ConfigError)
        if experts > MAX_EXPERTS:
            raise ConfigError(f"{at}: experts {experts} is more than {MAX_EXPERTS}")
    bench = replay["benchmark"]
    sizes = bench["top_k"], bench["capacity"], bench["experts"]
    check_shape(*sizes, where=f"{where}.benchmark", error=ConfigError)
    if bench["mean_tokens"] > bench["max_tokens"]:
        raise ConfigError(f"{where}.benchmark.mean_tokens: above max_tokens")


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
            check_shape(top_k, size, experts, where=f"{where}.{key}", error=ConfigError)
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
