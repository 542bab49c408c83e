"""The harness stage's commands: profile, gates, decoding, the per-layer probe, copy
bandwidth, the slower-link check and the GPU check."""

from __future__ import annotations

import json
import os
from pathlib import Path

from moecache.cli.command import add, load_settings, on_model, with_settings
from moecache.errors import MoecacheError
from moecache.records.io import read_record
from moecache.records.run import BatchedRunResult
from moecache.runs import BatchShape, RunName


def cmd_profile_model(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    report = jobs.run_profile(settings, args.model, args.sequences, args.out)
    print(json.dumps({k: v for k, v in report.items() if not k.endswith("per_layer")}))


def cmd_gates(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    report = jobs.run_gates(settings, args.model, args.sequences, args.out)
    print(
        f"gates passed: base NLL {report['base']['nll']:.6f}, batched "
        f"{report['batched_nll']:.6f}; pool/own-block throughput "
        f"{report['throughput_ratio_pool_vs_own_block']:.3f}"
    )


def cmd_decode(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    runs = jobs.run_decode(
        settings,
        args.model,
        args.sequences,
        args.shard,
        args.first_shard or args.shard,
        args.gates,
        args.out_dir,
        run=one_run(args),
        trace_dir=args.trace_dir,
    )
    for label, t in runs.items():
        low, high = t["tokens_per_second_ci"]
        print(
            f"{label}: NLL {t['nll']:.4f} (delta {t['delta_nll']:+.4f}), "
            f"{t['tokens_per_second']:.1f} tok/s (95% {low:.1f}-{high:.1f}), "
            f"{t['copies_per_token']:.2f} copies/token, {100 * t['copy_share']:.1f}% of a step"
        )


def cmd_decode_batched(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    where = {"shard": args.shard, "gates": args.gates, "trace": args.trace, "out_dir": args.out_dir}
    shape = None if args.shape is None else BatchShape.parse(args.shape)
    if (args.run is None) != (shape is None):
        raise MoecacheError("--run and --shape: give both (fan_out run) or neither")
    if shape is not None and shape.size != args.batch:
        raise MoecacheError(f"--shape {shape}: its B is not --batch {args.batch}")
    for path in jobs.run_decode_batched(
        settings, args.model, args.sequences, where, args.batch, args.run, shape
    ):
        totals = read_record(path, BatchedRunResult).totals
        low, high = totals["ms_per_sequence_token_ci"]
        print(
            f"{path.parent.name}/{path.stem}: {totals['copies_per_token']:.2f} copies and "
            f"{totals['ms_per_sequence_token']:.2f} ms (95% {low:.2f}-{high:.2f}) per "
            f"sequence-token, delta NLL {totals['delta_nll']:+.4f}"
        )


def one_run(args):
    """--run and --multiplier: the one run a fanned-out job decodes (None: every run)."""
    if args.run is None:
        if args.multiplier is not None:
            raise MoecacheError("--multiplier: give --run too")
        return None
    return RunName(args.run, args.multiplier or 1)


def cmd_probe_layers(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    report = jobs.run_probe(settings, args.model, args.sequences, args.gates, args.out)
    for row in report["layers"]:
        print(f"layer {row['layer']}: delta NLL {row['delta_nll']:+.4f}")


def cmd_link_check(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    report = jobs.run_link_check(settings, args.model, args.sequences, args.out)
    for row in report["runs"]:
        print(
            f"{row['run']}: compute {row['compute_ms']:.2f} ms per token "
            f"({row['compute_ratio_to_1x']:.2f} x 1x), tau {row['tau_ms']:.4f} ms "
            f"({row['tau_ratio_to_1x']:.1f} x 1x)"
        )


def cmd_bandwidth(args):
    from moecache.harness import jobs

    settings = load_settings(args, ("model", "harness"))
    r = jobs.run_bandwidth(settings, args.model, args.out)
    for m, row in r["multipliers"].items():
        print(
            f"x{m}: tau {row['tau_ms']:.4f} ms per expert copy ({row['ratio_to_1x']:.2f} x 1x), "
            f"group overhead {row['group_overhead_ms']:.4f} ms"
        )
    print(f"one large copy {r['large_gib_per_s']:.1f} GiB/s, loop {r['loop_gib_per_s']:.1f} GiB/s")


def cmd_tiers_harness(args):
    from moecache.harness import tier_record

    settings = load_settings(args, ("model", "harness"))
    record = tier_record.job(settings, args.model, args.sequences, args.out, args.gpu_check)
    prices = record["prices"]
    print(
        f"disk read ({record['disk_read']}) {prices['disk_to_host_ms']['ms']:.4f} ms, copy "
        f"{prices['host_to_device_ms']['ms']:.4f} ms, host compute "
        f"{prices['host_compute_ms']['ms']:.4f} ms per expert"
    )
    print("\n".join(tier_record.check_lines(record)[0]))


def cmd_tiers_check(args):
    from moecache.harness import tier_record
    from moecache.records.tiers_measured import TiersMeasuredResult

    lines, ok = tier_record.check_lines(read_record(args.record, TiersMeasuredResult).as_dict())
    print("\n".join(lines))
    if not ok:
        raise MoecacheError(f"{args.record}: the tier equation is not within 10% of every run")


def cmd_gpu_check(args):
    # Nothing is downloaded: set before the Hugging Face libraries are first imported.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    from moecache.harness import gpu_check

    gpu_check.run(args.out, args.device)


def register(sub) -> None:
    register_measures(sub)
    register_decodes(sub)
    register_checks(sub)


def register_measures(sub) -> None:
    """The harness's measurements beside decoding: the profile, the gates, each layer's
    probe, the copy bandwidth and the slower link's check."""
    p = with_settings(
        add(
            sub,
            "profile-model",
            cmd_profile_model,
            "time one expert copy and one token, measure routing reuse",
        )
    )
    on_model(p, "--sequences", "--out")
    p = with_settings(add(sub, "gates", cmd_gates, "exactness gates on one shard"))
    on_model(p, "--sequences", "--out")

    p = with_settings(
        add(
            sub,
            "probe-layers",
            cmd_probe_layers,
            "restrict one layer at a time; delta NLL per layer",
        )
    )
    on_model(p, "--sequences", "--gates", "--out")

    p = with_settings(add(sub, "bandwidth", cmd_bandwidth, "copy time and bandwidth per expert"))
    on_model(p, "--out")

    p = with_settings(
        add(sub, "link-check", cmd_link_check, "LRU's compute per token under each slower link")
    )
    on_model(p, "--sequences", "--out")


def register_decodes(sub) -> None:
    """A shard's decode under every run, and batched decoding."""
    p = with_settings(
        add(
            sub,
            "decode",
            cmd_decode,
            "decode one shard under every run interleaved, or one run beside its reference",
        )
    )
    on_model(p, "--sequences")
    p.add_argument("--shard", required=True, help="the shard's name (corpus.heldout.shards)")
    p.add_argument("--first-shard", help="the first shard, where runs decode at every multiplier")
    p.add_argument("--gates", required=True, type=Path, help="the shard's gates file")
    p.add_argument("--out-dir", required=True, type=Path, help="a results file a run")
    p.add_argument("--trace-dir", type=Path, help="a trace a run (default: --out-dir)")
    p.add_argument(
        "--run",
        help="decode only this run of harness.runs, beside its reference (harness.fan_out run)",
    )
    p.add_argument("--multiplier", type=int, help="--run's copy multiplier (default 1)")

    p = with_settings(
        add(
            sub,
            "decode-batched",
            cmd_decode_batched,
            "harness.batched's runs at batch size B, every batching and prefill, interleaved",
        )
    )
    on_model(p, "--sequences")
    p.add_argument("--shard", required=True, help="the shard's name (the first shard)")
    p.add_argument("--gates", required=True, type=Path, help="the shard's gates file")
    p.add_argument("--trace", required=True, type=Path, help="the trace run's trace")
    p.add_argument("--batch", required=True, type=int, help="B, one of harness.batch_sizes")
    p.add_argument("--out-dir", required=True, type=Path, help="<shape>/<run>.json under it")
    p.add_argument("--run", help="only this run of harness.batched.runs (fan_out run)")
    p.add_argument("--shape", help="--run's shape, as b4-static-p0 (fan_out run)")


def register_checks(sub) -> None:
    """The tiers harness and its check, and the GPU check."""
    p = with_settings(
        add(
            sub,
            "tiers-harness",
            cmd_tiers_harness,
            "decode over device slots, a host cache and the disk, for real (docs/tiers.md)",
        )
    )
    on_model(p, "--sequences", "--out")
    p.add_argument("--gpu-check", type=Path, help="a committed GPU check file (measured/)")

    p = add(
        sub,
        "tiers-check",
        cmd_tiers_check,
        "exit non-zero unless the tier equation is within 10%% of every tiered harness run",
    )
    p.add_argument("record", type=Path, help="a tiers-harness results file")

    p = add(
        sub,
        "gpu-check",
        cmd_gpu_check,
        "the harness on one CUDA device in under 8 minutes: gates, copy bandwidth, a paper-sized "
        "layer, paper-shaped models' memory and overlapped copies",
    )
    p.add_argument("--out", required=True, type=Path, help="the results file (JSON)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (default: cuda)")
