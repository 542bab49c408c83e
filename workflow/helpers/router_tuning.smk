# The models router_tuning.smk trains and measures, and where its rules find them.
# Without a `router_tuning` section these helpers give nothing, so none of its jobs is
# needed and Table 3 keeps its placeholder.
ROUTER = config.get("router_tuning") or {}
ROUTER_EMBEDDED = ROUTER.get("source") == "embedded"
ROUTER_VARIANTS = ["sft", "hit", "tag", "harness"]


def router_base(name):
    """The untuned model (and tokenizer) the stage starts from: this workflow's, or the
    source the section names."""
    if not ROUTER_EMBEDDED:
        return lambda wildcards, input: ROUTER["source"]
    return lambda wildcards, input: str(input[name])


def router_model(wildcards):
    if wildcards.measured == "base":
        return built("results/model") if ROUTER_EMBEDDED else []
    return [f"results/router_tuning/{wildcards.measured}"]


def router_model_path(wildcards, input):
    if wildcards.measured != "base":
        return f"{input.model}/model"
    return input.model if ROUTER_EMBEDDED else ROUTER["source"]


def router_tokenizer_path(wildcards, input):
    """A merged model's folder holds its tokenizer; the base's is the workflow's or the
    source's."""
    if wildcards.measured == "base" and ROUTER_EMBEDDED:
        return str(input.tokenizer)
    return router_model_path(wildcards, input)


def router_measured():
    if not ROUTER:
        return []
    return expand(
        "results/router_tuning/measured/{measured}.json",
        measured=["base", *ROUTER_VARIANTS],
    )
