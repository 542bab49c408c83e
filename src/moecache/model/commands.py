"""The model stage's commands: whether a run fits a GPU, and training the embedded model."""

from __future__ import annotations

import sys
from pathlib import Path

from moecache.command import add, load_settings, with_settings


def cmd_plan(args):
    from moecache.model import plan

    if args.configfile:
        args.config = args.configfile
    settings = load_settings(args, ("model", "harness", "corpus"))
    report = plan.plan(settings, args.gpu_gib)
    print("\n".join(plan.lines(report)))
    if args.out:
        from moecache.atomic import write_json

        write_json(args.out, report)
    if report.get("fits") is False:
        sys.exit(1)


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


def register(sub) -> None:
    p = with_settings(
        add(sub, "plan", cmd_plan, "say whether a run fits a GPU, from the model's config alone")
    )
    p.add_argument("--configfile", help="a whole config file (YAML), as --config")
    p.add_argument("--gpu-gib", type=float, help="the GPU memory to fit, GiB")
    p.add_argument("--out", type=Path, help="also write the plan as JSON")

    p = with_settings(add(sub, "train", cmd_train, "train the embedded tiny OLMoE"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
