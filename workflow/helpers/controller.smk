# The controller's heads files, sweep folders and their names (moecache.runs), for
# controller.smk and the accuracy rows that score the heads.
from moecache.config.stages import controller_heads as heads_of
from moecache.runs import (
    HEADS_PATTERN,
    POINT_PATTERN,
    HeadsName,
    point_name,
    threshold_of,
)

# Without a `controller` section these helpers give nothing, so none of its jobs is needed
# and its appendix table keeps its placeholder.
CONTROLLER = config.get("controller") or {}


def controller_heads():
    """Every heads file: objective x seed, then the first of each priced at each e."""
    return heads_of(CONTROLLER) if CONTROLLER else []


def heads_flags(wildcards):
    """--objective, --seed and --price of one heads file, from its name."""
    heads = HeadsName.parse(wildcards.heads)
    return f"--objective {heads.objective} --seed {heads.seed}" + (
        "" if heads.price is None else f" --price {heads.price:g}"
    )


def sweep_of(wildcards):
    """A sweep folder's point and copy multiplier (t50-x1)."""
    return RunName.parse(wildcards.sweep)


def sweep_point(wildcards):
    """A sweep job's threshold (t50 -> 0.5), or reference."""
    point = sweep_of(wildcards).run
    return (
        point if point == "reference" else threshold_of(point, CONTROLLER["thresholds"])
    )


def controller_sweeps():
    if not CONTROLLER:
        return []
    points = [point_name(t) for t in CONTROLLER["thresholds"]] + ["reference"]
    return [
        f"results/controller/sweep/{RunName(point, m)}"
        for point in points
        for m in CONTROLLER["multipliers"]
    ]


def controller_longer():
    return ["results/controller/longer"] if CONTROLLER else []
