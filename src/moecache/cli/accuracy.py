"""The accuracy stage's commands: build one lm-eval task, score every Table 2 row on it."""

from __future__ import annotations

from pathlib import Path

from moecache.cli.command import add, load_settings, on_model, with_settings
from moecache.errors import MoecacheError

ACCURACY_SECTIONS = ("model", "harness", "controller", "accuracy")


def cmd_accuracy_task(args):
    from moecache.accuracy import stage

    settings = load_settings(args, ("accuracy",))
    if args.task not in settings["accuracy"]["tasks"]:
        raise MoecacheError(f"--task {args.task}: not in accuracy.tasks")
    print(stage.build_task(settings, args.task, args.documents, args.out_dir))


def cmd_accuracy(args):
    from moecache.accuracy import stage

    settings = load_settings(args, ACCURACY_SECTIONS)
    report = stage.score(
        settings, args.model, args.tokenizer, args.task, args.sweep, args.heads_dir, args.out_dir
    )
    for row in report["rows"]:
        kept = "undefined" if row["retention"] is None else f"{row['retention']:.3f}"
        print(
            f"{row['row']}: accuracy {row['accuracy']:.3f}, retention {kept}, "
            f"switch rate {row['switch_rate']:.3f}"
        )


def register(sub) -> None:
    p = with_settings(add(sub, "accuracy-task", cmd_accuracy_task, "build one lm-eval task"))
    p.add_argument("--task", required=True, help="a name in accuracy.tasks")
    p.add_argument("--documents", nargs="*", type=Path, default=[], help="held-out text")
    p.add_argument("--out-dir", required=True, type=Path)
    p = with_settings(add(sub, "accuracy", cmd_accuracy, "every Table 2 row on one task"))
    on_model(p, "--task", "--out-dir", "--heads-dir")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder or hub id")
    p.add_argument("--sweep", nargs="*", type=Path, default=[], help="controller sweep folders")
