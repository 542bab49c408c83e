"""The controller stage's commands: train its heads, sweep its threshold, decode longer
sequences whole and cut."""

from __future__ import annotations

from pathlib import Path

from moecache.cli.command import add, load_settings, on_model, with_settings
from moecache.records.bandwidth import BandwidthResult
from moecache.records.io import read_dict

CONTROLLER_SECTIONS = ("corpus", "model", "harness", "controller")


def cmd_controller_train(args):
    from moecache.controller import train
    from moecache.costs import equation

    settings = load_settings(args, CONTROLLER_SECTIONS)
    tau = equation.tau_1x(read_dict(args.bandwidth, BandwidthResult))
    done = train.train(
        settings,
        args.objective,
        args.seed,
        args.price,
        args.model,
        args.tokenizer,
        args.text,
        tau,
        args.out,
    )
    first, last = done["log"][0], done["log"][-1]
    print(
        f"controller {args.out.stem}: {done['steps']} steps, objective "
        f"{first['objective']:.4f} -> {last['objective']:.4f}, refreshes per token "
        f"{first['refresh']:.3f} -> {last['refresh']:.3f}, {done['train_seconds']:.1f} s"
    )


def cmd_controller_sweep(args):
    from moecache.controller import evaluate

    settings = load_settings(args, CONTROLLER_SECTIONS)
    point = args.point if args.point == "reference" else float(args.point)
    heads = {path.stem: path for path in args.heads}
    found = evaluate.sweep(
        settings,
        args.model,
        args.sequences,
        args.shard,
        args.gates,
        heads,
        point,
        args.multiplier,
        args.out_dir,
    )
    for label, t in found.items():
        print(
            f"{label}: delta NLL {t['delta_nll']:+.4f}, {t['tokens_per_second']:.1f} tok/s, "
            f"{t['copies_per_token']:.2f} copies/token"
        )


def cmd_controller_longer(args):
    from moecache.controller import evaluate

    settings = load_settings(args, CONTROLLER_SECTIONS)
    summary = evaluate.longer(
        settings, args.model, args.sequences, args.shard, args.gates, args.heads, args.out_dir
    )
    for label in ("whole", "pieces"):
        for name, row in summary[label].items():
            print(
                f"{label} {name}: delta NLL {row['delta_nll']:+.4f}, "
                f"{row['copies_per_token']:.2f} copies/token"
            )


def register(sub) -> None:
    p = with_settings(
        add(sub, "controller-train", cmd_controller_train, "train the controller's heads")
    )
    on_model(p, "--tokenizer", "--text", "--bandwidth", "--out")
    p.add_argument("--objective", required=True, help="differentiable or reinforce")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--price", type=float, help="e: traffic priced at e * tau (default hand-set)")
    p = with_settings(
        add(sub, "controller-sweep", cmd_controller_sweep, "the controller at one threshold")
    )
    on_model(p, "--sequences", "--gates", "--out-dir")
    p.add_argument("--shard", required=True)
    p.add_argument("--point", required=True, help="a threshold, or reference")
    p.add_argument("--multiplier", type=int, default=1)
    p.add_argument("--heads", nargs="*", type=Path, default=[], help="heads files")
    p = with_settings(
        add(sub, "controller-longer", cmd_controller_longer, "longer sequences, whole and cut")
    )
    on_model(p, "--sequences", "--gates", "--heads", "--out-dir")
    p.add_argument("--shard", required=True)
