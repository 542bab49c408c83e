"""The trace format's commands: `moecache trace convert`, a routing log (ours or a serving
engine's) to a trace, and `moecache trace dump`, a trace back as JSON lines."""

from __future__ import annotations

from pathlib import Path

from moecache.errors import MoecacheError
from moecache.replay import importers


def cmd_trace_convert(args):
    from moecache.replay import convert, moe_layers

    if args.moe_layers is not None and args.model_config is not None:
        raise MoecacheError("--moe-layers and --model-config: give one of them")
    layers = None
    if args.moe_layers is not None:
        layers = moe_layers.parse(args.moe_layers)
    elif args.model_config is not None:
        layers = moe_layers.from_config(args.model_config)
    done = convert.convert(
        args.source,
        args.out,
        args.experts,
        args.group_rows,
        args.source_format,
        layers=layers,
        prompt=not args.no_prompt,
    )
    notes = [f"experts in {done['order']} order"] if "order" in done else []
    if done.get("prompt_tokens"):
        notes.append(f"{done['prompt_tokens']:,} prompt tokens, first in their sequences")
    if done.get("prompt_tokens_left_out"):
        notes.append(f"{done['prompt_tokens_left_out']:,} prompt tokens left out (--no-prompt)")
    print(
        f"{args.out}: {done['rows']:,} rows, {done['sequences']:,} sequences, "
        f"top-{done['top_k']} of {done['experts']} experts" + "".join(f"; {note}" for note in notes)
    )


def cmd_trace_dump(args):
    from moecache.replay import convert

    for line in convert.dump(args.trace):
        print(line)


def register(sub) -> None:
    trace = sub.add_parser("trace", help="the routing trace format anyone can write")
    verbs = trace.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("convert", help="a routing log (ours or another tool's) to a trace")
    p.set_defaults(func=cmd_trace_convert)
    p.add_argument(
        "source",
        type=Path,
        help='the log; by default JSON lines {"sequence", "layer", "token", "experts"}',
    )
    p.add_argument(
        "--from",
        dest="source_format",
        choices=importers.FORMATS,
        default="moecache",
        help="the log's format: ours, vLLM's routed experts, SGLang's per-token recorder "
        "dump, Megatron-LM's router trace, moe-policylang's recorder (JSON lines or "
        "Parquet), a NumPy [tokens, layers, k] array (docs/trace-format.md)",
    )
    p.add_argument(
        "--experts",
        type=int,
        help="experts per layer (N); policylang's header and SGLang's expert map say it",
    )
    p.add_argument(
        "--moe-layers",
        help="the model's MoE layers, e.g. 1-26 (vllm, sglang, numpy: a log with a column "
        "per decoder layer; the dense layers' columns are skipped)",
    )
    p.add_argument(
        "--model-config",
        type=Path,
        help="a checkpoint's config.json (or its folder), whose MoE layers --moe-layers would name",
    )
    p.add_argument(
        "--no-prompt",
        action="store_true",
        help="leave out vLLM's prompt_routed_experts (kept by default, before the choice's)",
    )
    p.add_argument("--out", type=Path, required=True, help="the trace to write (Parquet)")
    p.add_argument("--group-rows", type=int, default=1 << 20, help="rows per row group (about)")
    p = verbs.add_parser("dump", help="a trace back as JSON lines, stream after stream")
    p.set_defaults(func=cmd_trace_dump)
    p.add_argument("trace", type=Path)
