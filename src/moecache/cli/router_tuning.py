"""The router-tuning stage's commands: fine-tune one router variant, measure one model."""

from __future__ import annotations

from pathlib import Path

from moecache.cli.command import add, load_settings, on_model, with_settings

ROUTER_SECTIONS = ("corpus", "model", "harness", "router_tuning")


def cmd_router_train(args):
    from moecache.router_tuning import stage

    settings = load_settings(args, ROUTER_SECTIONS)
    done = stage.fine_tune(
        settings, args.variant, args.model, args.tokenizer, args.text, args.out_dir
    )
    hit = done["greedy_sim_hit_rate"]
    print(
        f"router {args.variant}: {done['steps']} steps, simulated hit rate (greedy) "
        f"{hit['start']:.3f} -> {hit['end']:.3f}, merged logits within "
        f"{done['merge_max_logit_gap']:.1e}, {done['seconds']:.1f} s"
    )


def cmd_router_measure(args):
    from moecache.router_tuning import stage

    settings = load_settings(args, ROUTER_SECTIONS)
    done = stage.measure(settings, args.name, args.model, args.tokenizer, args.sequences, args.out)
    for text in ("teacher_forced", "own_generations"):
        row = done[text]
        print(
            f"router {args.name} {text}: NLL {row['nll']:.4f}, LRU {row['lru_steady']}, "
            f"decayed frequency {row['decayed_frequency_steady']}, trained layer "
            f"{row['trained_layer_steady']} (hit rate {row['trained_layer_hit_rate']:.3f})"
        )


def register(sub) -> None:
    for name, func, what in (
        ("router-train", cmd_router_train, "fine-tune and merge one router variant"),
        ("router-measure", cmd_router_measure, "one model's copies in the harness"),
    ):
        p = with_settings(add(sub, name, func, what))
        on_model(p, "--tokenizer")
    p.add_argument("--name", required=True, help="base, sft, hit, tag or harness")
    p.add_argument("--sequences", required=True, type=Path, help="held-out sequences")
    p.add_argument("--out", required=True, type=Path)
    p = sub.choices["router-train"]
    p.add_argument("--variant", required=True, help="sft, hit, tag or harness")
    p.add_argument("--text", required=True, type=Path, help="the corpus's training part")
    p.add_argument("--out-dir", required=True, type=Path)
