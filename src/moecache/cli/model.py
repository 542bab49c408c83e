"""The model stage's commands: whether a run fits a GPU, and training the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

from moecache.atomic import write_json
from moecache.cli.command import add, load_settings, with_settings
from moecache.errors import MoecacheError
from moecache.plan import RESERVE_GIB

FIT_ONLY = (
    "host_gib",
    "disk_gbs",
    "bandwidth",
    "link_gbs",
    "compute_ms",
    "compute_from",
    "trace",
    "jobs",
    "reserve_gib",
)


def cmd_plan(args):
    from moecache.schedule import accountant

    if args.configfile:
        args.config = args.configfile
    settings = load_settings(args, ("model", "harness", "corpus"))
    if args.jobs and args.gpu_gib is None:  # the card the config is made for
        args.gpu_gib = settings["harness"].get("device_gib")
    if args.gpu_gib is not None:
        return plan_fit(args, settings)
    given = [name for name in FIT_ONLY if getattr(args, name) not in (None, False)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise MoecacheError(
            f"{flag}: give --gpu-gib G, the GPU it plans for (or harness.device_gib)"
            if flag == "--jobs"
            else f"{flag}: give --gpu-gib G, the GPU it plans for"
        )
    report = accountant.account(settings, source=args.model, tokens=args.tokens)
    print(json.dumps(report, indent=1) if args.json else "\n".join(accountant.lines(report)))
    if args.out:
        write_json(args.out, report)


def plan_fit(args, settings):
    """The largest C with every MoE layer offloaded, its peaks and its ms/token."""
    from moecache.plan import fit, inputs, said

    compute = None
    if args.compute_ms is not None:
        compute = inputs.stated_compute(args.compute_ms)
    elif args.compute_from is not None:
        compute = inputs.compute_from_run(
            args.compute_from, args.model or settings["model"]["source"]
        )
    answer = fit.answer(
        settings,
        args.gpu_gib,
        args.host_gib,
        source=args.model,
        tokens=args.tokens,
        bandwidth=args.bandwidth,
        link_gbs=args.link_gbs,
        compute=compute,
        trace=args.trace,
        figure="jobs" if args.jobs else "run",
        disk_gbs=args.disk_gbs,
        reserve_gib=reserved(args),
    )
    print(json.dumps(answer, indent=1) if args.json else "\n".join(said.lines(answer)))
    if args.out:
        write_json(args.out, answer)


def reserved(args) -> float:
    """--reserve-gib, else the stated default (moecache.plan.RESERVE_GIB), refused below 0."""
    from moecache.plan import fit

    given = RESERVE_GIB if args.reserve_gib is None else args.reserve_gib
    fit.check_reserve(given)
    return given


def cmd_plan_table(args):
    from moecache.plan import cards

    kept = reserved(args)
    if args.jobs:
        if args.bandwidth is not None:
            raise MoecacheError("--bandwidth: the --jobs table predicts no ms/token")
        print(cards.cards_table(args.configfile, args.gpu_gib or (), kept))
        return
    if not args.gpu_gib:
        raise MoecacheError("--gpu-gib: give the GPU sizes (or --jobs, each config's card)")
    print(cards.table(args.configfile, args.gpu_gib, args.bandwidth, kept))


def cmd_train(args):
    from moecache.data import corpus
    from moecache.model import train

    settings = load_settings(args, ("model", "training"))
    texts = [doc["text"] for doc in corpus.read(args.train)]
    summary = train.train(settings, args.tokenizer, texts, args.out)
    last = summary["log"][-1]
    print(
        f"trained {summary['parameters']:,} parameters on {summary['tokens_seen']:,} tokens; "
        f"final lm loss {last['lm_loss']:.3f}"
    )


def reserve_flag(p) -> None:
    p.add_argument(
        "--reserve-gib",
        type=float,
        help=f"GiB of the GPU kept back for the CUDA context, the allocator's fragmentation "
        f"and activations, which the plan does not count; C fits the rest (default "
        f"{RESERVE_GIB:g}, stated, not measured)",
    )


def register(sub) -> None:
    register_plan(sub)
    register_plan_table(sub)
    register_train(sub)


def register_plan(sub) -> None:
    p = with_settings(
        add(
            sub,
            "plan",
            cmd_plan,
            "what a run holds, and with --gpu-gib the largest C that fits and its ms/token, "
            "from the model's config alone",
        )
    )
    p.add_argument("--configfile", help="a whole config file (YAML), as --config")
    p.add_argument("--model", help="a checkpoint folder whose config.json replaces model.source's")
    p.add_argument("--tokens", type=int, help="the KV cache's tokens (default: held-out max)")
    p.add_argument(
        "--gpu-gib",
        type=float,
        help="the GPU memory, GiB: the largest C per layer with every MoE layer offloaded",
    )
    p.add_argument(
        "--host-gib",
        type=float,
        help="the host RAM, GiB: the experts per layer it holds, the rest on disk (docs/plan.md)",
    )
    p.add_argument(
        "--disk-gbs",
        type=float,
        help="a disk read from a stated disk link, GiB/s (default: the config's "
        "tiers.disk_to_host_ms)",
    )
    p.add_argument(
        "--jobs",
        action="store_true",
        help="choose C by the study's jobs' device peak on a card of --gpu-gib (harness.device_gib "
        "set to it), not by one run's",
    )
    reserve_flag(p)
    tau = p.add_mutually_exclusive_group()
    tau.add_argument("--bandwidth", type=Path, help="tau from a measured bandwidth file")
    tau.add_argument("--link-gbs", type=float, help="tau from a stated link, GiB/s")
    compute = p.add_mutually_exclusive_group()
    compute.add_argument("--compute-ms", type=float, help="c, the compute per token, ms (stated)")
    compute.add_argument("--compute-from", type=Path, help="c from a decode run's results file")
    p.add_argument("--trace", type=Path, help="rho from replaying this trace at C")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("--out", type=Path, help="also write the answer as JSON")


def register_plan_table(sub) -> None:
    p = add(
        sub,
        "plan-table",
        cmd_plan_table,
        "docs/plan.md's table: plan --gpu-gib over configs and GPU sizes, as Markdown",
    )
    p.add_argument("--configfile", nargs="+", required=True, help="config files (YAML)")
    p.add_argument(
        "--gpu-gib",
        nargs="+",
        type=float,
        help="GPU sizes, GiB (with --jobs: for the configs without harness.device_gib)",
    )
    p.add_argument("--bandwidth", type=Path, help="tau from a measured bandwidth file")
    p.add_argument(
        "--jobs",
        action="store_true",
        help="the card configs' table: C chosen by the study's jobs, each config on its own "
        "harness.device_gib",
    )
    reserve_flag(p)


def register_train(sub) -> None:
    p = with_settings(add(sub, "train", cmd_train, "train the embedded tiny OLMoE"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
