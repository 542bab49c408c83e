"""The `moecache` command line: each pipeline stage is one subcommand; rules only call these.

Settings come either from a whole config file (`--config FILE`, validated in full) or, as
the Snakemake rules pass them, as JSON holding just the sections a stage reads
(`--settings JSON`), so a rule reruns only when its own sections change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from moecache import config as configs
from moecache.atomic import atomic_dir, read_json
from moecache.errors import MoecacheError


def load_settings(args: argparse.Namespace, sections: tuple[str, ...]) -> dict:
    if args.config:
        settings = configs.load(args.config)
    elif args.settings:
        try:
            settings = json.loads(args.settings)
        except json.JSONDecodeError as error:
            raise MoecacheError(f"--settings: not valid JSON ({error})") from None
        configs.validate_schema(settings, required=("seed", "hub_offline", *sections))
    else:
        raise MoecacheError("give --config FILE or --settings JSON")
    if settings["hub_offline"]:
        # Read by huggingface_hub, datasets and transformers when they are first imported.
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ[name] = "1"
    return settings


def cmd_validate_config(args):
    configs.load(args.file)
    print(f"{args.file}: valid")


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


def cmd_corpus(args):
    from moecache.data import corpus

    settings = load_settings(args, ("corpus",))
    corpus.write(corpus.build(settings["corpus"], settings["seed"]), args.out_dir)


def cmd_tokenizer(args):
    from moecache.data import corpus, tokenizer

    settings = load_settings(args, ("tokenizer",))
    texts = [doc["text"] for doc in corpus.read(args.train)]
    tokenizer.train(texts, settings["tokenizer"]["vocab_size"], args.out)


def cmd_heldout(args):
    from moecache.data import corpus, tokenizer

    settings = load_settings(args, ("corpus",))
    tok = tokenizer.load(args.tokenizer)
    max_tokens = settings["corpus"]["heldout"]["max_tokens"]
    rows = corpus.sequences(tok, corpus.read(args.text), max_tokens)
    corpus.write_sequences(rows, args.out)


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
    )
    for label, t in runs.items():
        low, high = t["tokens_per_second_ci"]
        print(
            f"{label}: NLL {t['nll']:.4f} (delta {t['delta_nll']:+.4f}), "
            f"{t['tokens_per_second']:.1f} tok/s (95% {low:.1f}-{high:.1f}), "
            f"{t['copies_per_token']:.2f} copies/token, {100 * t['copy_share']:.1f}% of a step"
        )


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


def cmd_gpu_check(args):
    # Nothing is downloaded: set before the Hugging Face libraries are first imported.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    from moecache.harness import gpu_check

    gpu_check.run(args.out, args.device)


def read_demand(args):
    from moecache.harness import trace
    from moecache.replay import demand, tracefile

    if args.trace:
        if tracefile.header(args.trace) is not None:  # the versioned trace anyone can write
            return tracefile.read_demand(args.trace), args.trace
        return trace.read_demand(args.trace, args.experts), args.trace
    if args.experts is None:
        raise MoecacheError("--demand: give --experts N, the layer's expert count")
    return demand.read_jsonl(args.demand, args.experts), args.demand


def emit(args, report: dict, summary: list[str], sources=(), origin=None) -> None:
    """The report as JSON (--json on stdout, --out to a file) or as summary lines.
    `origin`: the config hash and device the numbers trace back to (a trace's run, or the
    settings and machine of a sweep or benchmark)."""
    from moecache import provenance

    provenance.write_results(args.out, report, origin=origin, inputs=sources)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n".join(summary))


def percent(share) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def cmd_replay(args):
    from moecache.replay import engine, stream, tracefile

    if args.trace and tracefile.header(args.trace) is not None:
        # The trace anyone can write may be a production day: streamed, a batch at a time.
        report = stream.report(args.trace, args.capacity, args.rule)
        source, origin = args.trace, None
    else:
        demand, source = read_demand(args)
        report = engine.report(demand, args.capacity, args.rule)
        origin = demand.origin
    lines = [f"{'rule':34s} {'fills':>7s} {'steady':>8s} {'per token':>9s} {'gap':>7s}"]
    for rule, r in report["rules"].items():
        t = r["totals"]
        rate = "n/a" if t["copies_per_token"] is None else f"{t['copies_per_token']:.2f}"
        lines.append(
            f"{rule:34s} {t['fills']:7d} {t['steady']:8d} {rate:>9s} "
            f"{percent(t['gap_recovered']):>7s}"
        )
    emit(args, report, lines, [source], origin)


def cmd_bound(args):
    from moecache.replay import bound, stream, tracefile

    mixed = None
    if args.mixed_share is not None:
        mixed = {"share": args.mixed_share, "cost": args.mixed_cost, "seed": args.seed}
    if args.trace and tracefile.header(args.trace) is not None:  # streamed, as replay
        report = stream.bounds(args.trace, args.capacity, mixed)
        source, origin = args.trace, None
    else:
        demand, source = read_demand(args)
        report = bound.report(demand, args.capacity, mixed)
        origin = demand.origin
    t = report["totals"]
    lines = [
        f"B_flat {t['b_flat']} <= B* {t['b_star']} <= B_greedy {t['b_greedy']} "
        f"(gap {percent(t['gap'])}); greedy optimal on {percent(t['greedy_optimal_share'])} "
        f"of {t['streams']} streams; LP integral {t['integral']}, certified {t['certified']}, "
        f"{t['lp_seconds']:.2f} s; median stream gap {percent(t['median_stream_gap'])}"
    ]
    if mixed:
        m = report["mixed_precision"]["totals"]
        lines.append(
            f"mixed precision ({args.mixed_share:g} of experts at cost {args.mixed_cost:g}): "
            f"LP {m['lp']:g}, farthest-future {m['farthest_future']:g} "
            f"(+{percent(m['farthest_future_gap'])}), cheapest {m['cheapest']:g}"
        )
    emit(args, report, lines, [source], origin)


def cmd_optimum(args):
    from moecache.replay import bound

    demand, source = read_demand(args)
    report = bound.optimum_report(demand, args.capacity)
    lines = [f"{'stream':24s} {'B_flat':>7s} {'optimum':>8s} {'DP':>5s} {'greedy':>7s} integral"]
    for r in report["streams"]:
        by_dp = "-" if r["dp"] is None else str(r["dp"])
        lines.append(
            f"{r['stream']:24s} {r['b_flat']:7d} {r['optimum']:8d} {by_dp:>5s} "
            f"{r['b_greedy']:7d} {r['integral']}"
        )
    emit(args, report, lines, [source], demand.origin)


def cmd_foresight(args):
    from moecache.replay import foresight, stream, tracefile

    if args.trace and tracefile.header(args.trace) is not None:  # streamed, as replay
        report = stream.foresight(args.trace, args.capacity, args.foresight, args.heldout_last)
        source, origin = args.trace, None
    else:
        demand, source = read_demand(args)
        report = foresight.curve(demand, args.capacity, args.foresight, args.heldout_last)
        origin = demand.origin
    lines = []
    for name, subset in report["subsets"].items():
        points = ", ".join(
            f"{p['k'] or 'unlimited'}: {percent(p['gap_recovered'])}" for p in subset["foresight"]
        )
        causal = ", ".join(f"{r} {percent(s)}" for r, s in subset["causal"].items())
        lines.append(f"{name} ({subset['streams']} streams): foresight {points}; causal {causal}")
    emit(args, report, lines, [source], origin)


def cmd_optimum_sweep(args):
    from moecache import provenance
    from moecache.replay import sweep

    settings = load_settings(args, ("replay",))
    report = sweep.run(settings["replay"]["optimum"], settings["seed"])
    emit(
        args,
        report,
        [
            f"{report['instances']} instances (k/C {report['k_over_c']}): greedy not optimal on "
            f"{report['greedy_not_optimal']}, above LRU on {report['greedy_above_lru']}; "
            f"the LP equals the DP on all"
        ],
        origin=provenance.stamp(settings, "cpu"),
    )


def cmd_benchmark_replay(args):
    from moecache import provenance
    from moecache.replay import benchmark

    settings = load_settings(args, ("replay",))
    bench = settings["replay"]["benchmark"]
    if args.trace:
        demand, sources = read_demand(args)[0], [args.trace]
    else:
        demand, sources = benchmark.paper_scale(bench, settings["seed"]), []
    report = benchmark.run(demand, bench["capacity"], bench["rounds"], settings["seed"])
    lines = [
        f"{report['requests']:,} requests in {report['streams']} streams; the LP on all "
        f"streams {report['lp']['lp_seconds']:.2f} s"
    ]
    for rule, r in report["rules"].items():
        theirs = r["libcachesim"]
        versus = (
            f"libCacheSim {theirs['algorithm']} {theirs['requests_per_second'] / 1e6:.2f} M "
            f"req/s (ratio {r['speed_ratio']:.2f}, 95% "
            f"{r['speed_ratio_interval'][0]:.2f}-{r['speed_ratio_interval'][1]:.2f})"
            if r["speed_ratio"] is not None
            else f"libCacheSim {theirs['algorithm']} {theirs['skipped']}"
        )
        lines.append(
            f"{rule}: replay {r['replay']['requests_per_second'] / 1e6:.2f} M req/s, {versus}"
        )
    emit(args, report, lines, sources, provenance.stamp(settings, "cpu"))


def cmd_trace_convert(args):
    from moecache.replay import convert

    done = convert.convert(args.source, args.out, args.experts, args.group_rows)
    print(
        f"{args.out}: {done['rows']:,} rows, {done['sequences']:,} sequences, "
        f"top-{done['top_k']} of {done['experts']} experts"
    )


def cmd_trace_dump(args):
    from moecache.replay import convert

    for line in convert.dump(args.trace):
        print(line)


def cmd_benchmark_replay_scale(args):
    from moecache import provenance
    from moecache.replay import scale

    shape = {
        "sequences": args.sequences,
        "tokens": args.tokens,
        "layers": args.layers,
        "experts": args.experts,
        "top_k": args.top_k,
    }
    for name, value in shape.items():
        if value < 1:
            raise MoecacheError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    if not shape["top_k"] <= args.capacity <= shape["experts"]:
        raise MoecacheError(f"--capacity {args.capacity}: need top-k <= C <= experts")
    report = scale.run(shape, args.capacity, args.seed, args.tmp)
    lines = [
        f"{report['requests']:,} requests ({report['streams']:,} streams), peak memory "
        f"{report['peak_memory_gib']:.2f} GiB; read alone {report['read_seconds']:.1f} s"
    ]
    for rule, r in report["rules"].items():
        lines.append(f"{rule}: {r['seconds']:.1f} s, {r['requests_per_second'] / 1e6:.2f} M req/s")
    emit(args, report, lines, origin=provenance.stamp({"replay_scale": shape}, "cpu"))


def cmd_choose(args):
    from moecache.report import cost_model

    if args.bandwidth is not None:
        bandwidth = cost_model.read_run(args.bandwidth)
        tau1 = cost_model.tau_1x(bandwidth)
    elif args.tau_ms is not None:
        tau1 = args.tau_ms
    else:
        raise MoecacheError("give --bandwidth FILE (moecache bandwidth) or --tau-ms")
    if args.tau_ms is not None:
        tau = args.tau_ms * args.multiplier
    else:
        # The copy time measured through the link m times slower, else m x tau(1).
        tau = cost_model.tau_at(bandwidth, args.multiplier, args.bandwidth, strict=False)
    points = cost_model.read_points(args.runs, tau1)
    report = cost_model.choose_report(points, tau, args.max_loss, args.seed)
    lines = cost_model.choose_summary(report)
    emit(args, report, lines, [*args.runs, *([args.bandwidth] if args.bandwidth else [])])


def cmd_learned_trace(args):
    from moecache.learned import stage

    settings = load_settings(args, ("corpus", "model", "harness"))
    done = stage.record_trace(settings, args.model, args.tokenizer, args.text, args.out)
    print(f"training trace: {done['sequences']} sequences, {done['tokens']} tokens")


def cmd_learned_labels(args):
    from moecache.learned import labels

    demand, source = read_demand(args)
    events = labels.oracle_events(demand, args.capacity)
    labels.write(events, args.out)
    print(f"{source}: {len(events)} evictions of farthest-future labelled")


def cmd_learned_fit(args):
    from moecache.harness import trace
    from moecache.learned import labels, stage

    settings = load_settings(args, ("model", "harness", "replay", "learned"))
    demand = trace.read_demand(args.trace, settings["model"]["architecture"]["num_experts"])
    with atomic_dir(args.out_dir) as tmp:
        summaries = stage.fit_group(settings, args.group, demand, labels.read(args.labels), tmp)
    for kind, summary in summaries.items():
        shares = ", ".join(percent(r["validation_gap_recovered"]) for r in summary["rounds"])
        print(
            f"{args.group}/{kind}: validation loss {summary['initial_validation_loss']:.4f} -> "
            f"{summary['validation_loss']:.4f} (step {summary['selected_step']} of "
            f"{summary['steps']}); validation share by round {shares}; "
            f"{summary['seconds']:.1f} s"
        )


def cmd_learned_closed_loop(args):
    from moecache.learned import stage

    settings = load_settings(args, ("model", "harness", "learned"))
    runs = stage.closed_loop(
        settings, args.model, args.sequences, args.shard, args.gates, args.out_dir
    )
    for label, t in runs.items():
        print(
            f"{label}: {t['fills'] + t['steady_copies']} copies, {t['tokens_per_second']:.1f} tok/s"
        )


def named_files(values: list[str], flag: str) -> dict[str, Path]:
    """shard=path pairs."""
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            raise MoecacheError(f"{flag} {value!r}: give shard=path")
        out[name] = Path(path)
    return out


def files_in(paths: list[Path], pattern: str) -> list[Path]:
    """Each path that is a file, and the files matching `pattern` in each that is a folder."""
    return [f for p in paths for f in (sorted(p.glob(pattern)) if p.is_dir() else [p])]


def cmd_learned_evaluate(args):
    from moecache.learned import stage

    settings = load_settings(args, ("model", "harness", "replay", "learned"))
    traces = named_files(args.trace, "--trace")
    curves = named_files(args.foresight, "--foresight")
    if set(curves) != set(traces):
        raise MoecacheError("--foresight: give one curve for every shard of --trace")
    # Files, or the folders the closed-loop and fit jobs wrote them to.
    closed = files_in(args.closed_loop, "*.json")
    scorers = files_in(args.scorers, "*.safetensors")
    report = stage.evaluate(settings, traces, scorers, curves, closed)
    lines = []
    for shard, result in report["shards"].items():
        for name, row in result["replay"]["heldout"].items():
            everything = result["replay"]["all"][name]["gap_recovered"]
            lines.append(
                f"{shard} {name:28s} held out {percent(row['gap_recovered']):>7s}, "
                f"all {percent(everything):>7s}"
            )
        for name, loop in result["closed_loop"].items():
            lines.append(
                f"{shard} {name:28s} closed loop held out "
                f"{percent(loop['heldout']['gap_recovered'])}, equals replay "
                f"{loop['matches_replay']}, delta NLL {loop['delta_nll']:+.2e}"
            )
    sources = [*traces.values(), *scorers, *curves.values(), *closed]
    emit(args, report, lines, sources, provenance_of(settings))


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


CONTROLLER_SECTIONS = ("corpus", "model", "harness", "controller")


def cmd_controller_train(args):
    from moecache.controller import train
    from moecache.report import cost_model

    settings = load_settings(args, CONTROLLER_SECTIONS)
    tau = cost_model.tau_1x(read_json(args.bandwidth, "a bandwidth file"))
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


def provenance_of(settings):
    from moecache import provenance

    return provenance.stamp(settings, settings["harness"]["device"])


def built(builders: dict, args):
    """A table or figure from its builder, given the flags its parameters name."""
    import inspect

    if args.name not in builders:
        raise MoecacheError(f"unknown name {args.name!r} (known: {', '.join(sorted(builders))})")
    build = builders[args.name]
    return build(**{name: getattr(args, name) for name in inspect.signature(build).parameters})


def cmd_table(args):
    from moecache.report import tables

    table = built(tables.BUILDERS, args)
    tables.write(table, args.out_dir)


def cmd_figure(args):
    from moecache.report import figures

    fig, sources = built(figures.BUILDERS, args)
    figures.write(args.name, fig, sources, args.out_dir)


def cmd_numbers(args):
    from moecache.report import numbers

    if args.source:
        sections, source = numbers.read_sections(args.source), str(args.source)
    else:
        sections = numbers.build(args.workdir, args.shards, args.runs, args.bandwidth)
        source = f"the results under {args.workdir}"
    if args.out:
        numbers.write(sections, args.out)
    if args.readme:
        numbers.refresh(args.readme, sections, source)
    if not (args.out or args.readme):
        print(numbers.render(sections), end="")


def cmd_claims(args):
    from moecache.report import claims

    rows = claims.scorecard(args.workdir, args.shards)
    if args.out_dir:
        claims.write(rows, args.out_dir, args.workdir)
    else:
        print(claims.render(rows))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="moecache", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)

    def command(name, func, help):
        p = sub.add_parser(name, help=help)
        p.set_defaults(func=func)
        return p

    def with_settings(p):
        group = p.add_mutually_exclusive_group()
        group.add_argument("--config", help="a whole config file (YAML)")
        group.add_argument("--settings", help="JSON with the sections this stage reads")
        return p

    def on_model(p, *flags):
        """The model and held-out sequences a harness stage reads, plus its own flags."""
        p.add_argument("--model", required=True, help="a model folder or hub id")
        for flag in flags:
            p.add_argument(flag, required=True, type=Path)
        return p

    p = command("validate-config", cmd_validate_config, "check a config file against the schema")
    p.add_argument("file")

    p = with_settings(
        command("plan", cmd_plan, "say whether a run fits a GPU, from the model's config alone")
    )
    p.add_argument("--configfile", help="a whole config file (YAML), as --config")
    p.add_argument("--gpu-gib", type=float, help="the GPU memory to fit, GiB")
    p.add_argument("--out", type=Path, help="also write the plan as JSON")

    p = with_settings(command("corpus", cmd_corpus, "build the training text and held-out shards"))
    p.add_argument("--out-dir", required=True, type=Path)

    p = with_settings(command("tokenizer", cmd_tokenizer, "train the byte-level BPE tokenizer"))
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(command("heldout", cmd_heldout, "tokenize one held-out shard"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(command("train", cmd_train, "train the embedded tiny OLMoE"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(
        command(
            "profile-model",
            cmd_profile_model,
            "time one expert copy and one token, measure routing reuse",
        )
    )
    on_model(p, "--sequences", "--out")
    p = with_settings(command("gates", cmd_gates, "exactness gates on one shard"))
    on_model(p, "--sequences", "--out")

    p = with_settings(
        command("decode", cmd_decode, "decode one shard under every run, interleaved")
    )
    on_model(p, "--sequences")
    p.add_argument("--shard", required=True, help="the shard's name (corpus.heldout.shards)")
    p.add_argument("--first-shard", help="the first shard, where runs decode at every multiplier")
    p.add_argument("--gates", required=True, type=Path, help="the shard's gates file")
    p.add_argument("--out-dir", required=True, type=Path, help="a results file and trace a run")

    p = with_settings(
        command(
            "probe-layers", cmd_probe_layers, "restrict one layer at a time; delta NLL per layer"
        )
    )
    on_model(p, "--sequences", "--gates", "--out")

    p = with_settings(command("bandwidth", cmd_bandwidth, "copy time and bandwidth per expert"))
    on_model(p, "--out")

    p = with_settings(
        command("link-check", cmd_link_check, "LRU's compute per token under each slower link")
    )
    on_model(p, "--sequences", "--out")

    p = command(
        "gpu-check",
        cmd_gpu_check,
        "the harness on one CUDA device in minutes: gates, copy bandwidth, a paper-sized layer",
    )
    p.add_argument("--out", required=True, type=Path, help="the results file (JSON)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (default: cuda)")

    def results(p):
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--out", type=Path, help="write the report as JSON to this file")
        return p

    def on_demand(p, capacity=True):
        """Demand from a harness trace or a JSON-lines file, and the pool size."""
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--trace",
            type=Path,
            help="a trace: moecache-trace (docs/trace-format.md) or a harness one",
        )
        source.add_argument(
            "--demand", type=Path, help='JSON lines: {"stream": id, "tokens": [[e, ...], ...]}'
        )
        p.add_argument("--experts", type=int, help="experts per layer (N; needed with --demand)")
        if capacity:
            p.add_argument("--capacity", type=int, required=True, help="pool slots (C)")
        return results(p)

    p = results(
        command(
            "benchmark-replay-scale",
            cmd_benchmark_replay_scale,
            "every rule over a generated trace of production size, streamed: seconds, memory",
        )
    )
    for flag, default, what in (
        ("--sequences", 400, "sequences"),
        ("--tokens", 1000, "tokens per sequence"),
        ("--layers", 32, "MoE layers"),
        ("--experts", 64, "experts per layer (N)"),
        ("--top-k", 8, "experts per token (k)"),
        ("--capacity", 32, "pool slots (C)"),
        ("--seed", 0, "seed of the generated demand"),
    ):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--tmp", type=Path, help="folder for the generated trace (default: $TMPDIR)")

    trace = sub.add_parser("trace", help="the routing trace format anyone can write")
    verbs = trace.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("convert", help="JSON lines (one per layer and token) to a trace")
    p.set_defaults(func=cmd_trace_convert)
    p.add_argument(
        "source", type=Path, help='JSON lines: {"sequence", "layer", "token", "experts"}'
    )
    p.add_argument("--experts", type=int, required=True, help="experts per layer (N)")
    p.add_argument("--out", type=Path, required=True, help="the trace to write (Parquet)")
    p.add_argument("--group-rows", type=int, default=1 << 20, help="rows per row group (about)")
    p = verbs.add_parser("dump", help="a trace back as JSON lines, stream after stream")
    p.set_defaults(func=cmd_trace_dump)
    p.add_argument("trace", type=Path)

    p = on_demand(command("replay", cmd_replay, "replay demand under lossless eviction rules"))
    p.add_argument(
        "--rule",
        action="append",
        help="a rule, with parameters as name:key=value,...; repeat for more (default: all)",
    )
    p = on_demand(command("bound", cmd_bound, "B_flat, the exact B* (LP) and greedy B_greedy"))
    p.add_argument(
        "--mixed-share",
        type=float,
        help="share of experts at lower precision: adds the LP against greedy at their costs",
    )
    p.add_argument("--mixed-cost", type=float, default=0.5, help="their cost per copy")
    p.add_argument("--seed", type=int, default=0, help="seed of the experts drawn")
    on_demand(command("optimum", cmd_optimum, "the exact fewest copies per stream (the LP)"))
    p = on_demand(command("foresight", cmd_foresight, "gap recovered with k tokens of foresight"))
    p.add_argument("--foresight", type=int, nargs="+", required=True, help="values of k")
    p.add_argument(
        "--heldout-last", type=int, default=0, help="the last this many sequences are held out"
    )
    results(
        with_settings(
            command("optimum-sweep", cmd_optimum_sweep, "greedy against the exact optimum")
        )
    )
    p = results(
        with_settings(
            command("benchmark-replay", cmd_benchmark_replay, "replay speed beside libCacheSim's")
        )
    )
    p.add_argument("--trace", type=Path, help="time this harness trace instead")
    p.add_argument("--experts", type=int, help=argparse.SUPPRESS)

    p = results(command("choose", cmd_choose, "the fastest policy within a loss limit"))
    p.add_argument("--runs", nargs="+", required=True, type=Path, help="decode results at 1x")
    p.add_argument(
        "--bandwidth",
        type=Path,
        help="this machine's copy time (moecache bandwidth): tau(1) sets each run's c",
    )
    p.add_argument(
        "--tau-ms",
        type=float,
        help="price copies at this time per expert (times --multiplier); also tau(1) "
        "when no --bandwidth is given",
    )
    p.add_argument(
        "--multiplier",
        type=float,
        default=1.0,
        help="price copies m times slower (the bandwidth file's tau(m) where it measured m)",
    )
    p.add_argument("--max-loss", type=float, required=True, help="largest Delta NLL allowed")
    p.add_argument("--seed", type=int, default=0, help="seed of the paired bootstrap")

    p = with_settings(
        command("learned-trace", cmd_learned_trace, "record the routing of training sequences")
    )
    on_model(p, "--text", "--out")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder or hub id")
    p = on_demand(
        command("learned-labels", cmd_learned_labels, "farthest-future's evictions, as labels")
    )
    p = with_settings(command("learned-fit", cmd_learned_fit, "train one eviction scorer"))
    p.add_argument("--group", required=True, help="router, trace-past-use or past-use-<shard>")
    for flag in ("--trace", "--labels", "--out-dir"):
        p.add_argument(flag, required=True, type=Path)
    p = with_settings(
        command("learned-closed-loop", cmd_learned_closed_loop, "decode with learned scorers")
    )
    on_model(p, "--sequences", "--gates", "--out-dir")
    p.add_argument("--shard", required=True)
    p = results(
        with_settings(
            command("learned-evaluate", cmd_learned_evaluate, "scorers' share of the gap")
        )
    )
    p.add_argument("--trace", nargs="+", required=True, help="shard=trace of each shard")
    p.add_argument("--foresight", nargs="+", required=True, help="shard=foresight results")
    p.add_argument(
        "--scorers", nargs="+", required=True, type=Path, help="scorer files or their folders"
    )
    p.add_argument("--closed-loop", nargs="*", default=[], type=Path, help="closed-loop runs")

    for name, func, what in (
        ("router-train", cmd_router_train, "fine-tune and merge one router variant"),
        ("router-measure", cmd_router_measure, "one model's copies in the harness"),
    ):
        p = with_settings(command(name, func, what))
        on_model(p, "--tokenizer")
    p.add_argument("--name", required=True, help="base, sft, hit, tag or harness")
    p.add_argument("--sequences", required=True, type=Path, help="held-out sequences")
    p.add_argument("--out", required=True, type=Path)
    p = sub.choices["router-train"]
    p.add_argument("--variant", required=True, help="sft, hit, tag or harness")
    p.add_argument("--text", required=True, type=Path, help="the corpus's training part")
    p.add_argument("--out-dir", required=True, type=Path)

    p = with_settings(
        command("controller-train", cmd_controller_train, "train the controller's heads")
    )
    on_model(p, "--tokenizer", "--text", "--bandwidth", "--out")
    p.add_argument("--objective", required=True, help="differentiable or reinforce")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--price", type=float, help="e: traffic priced at e * tau (default hand-set)")
    p = with_settings(
        command("controller-sweep", cmd_controller_sweep, "the controller at one threshold")
    )
    on_model(p, "--sequences", "--gates", "--out-dir")
    p.add_argument("--shard", required=True)
    p.add_argument("--point", required=True, help="a threshold, or reference")
    p.add_argument("--multiplier", type=int, default=1)
    p.add_argument("--heads", nargs="*", type=Path, default=[], help="heads files")
    p = with_settings(
        command("controller-longer", cmd_controller_longer, "longer sequences, whole and cut")
    )
    on_model(p, "--sequences", "--gates", "--heads", "--out-dir")
    p.add_argument("--shard", required=True)

    p = with_settings(command("accuracy-task", cmd_accuracy_task, "build one lm-eval task"))
    p.add_argument("--task", required=True, help="a name in accuracy.tasks")
    p.add_argument("--documents", nargs="*", type=Path, default=[], help="held-out text")
    p.add_argument("--out-dir", required=True, type=Path)
    p = with_settings(command("accuracy", cmd_accuracy, "every Table 2 row on one task"))
    on_model(p, "--task", "--out-dir", "--heads-dir")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder or hub id")
    p.add_argument("--sweep", nargs="*", type=Path, default=[], help="controller sweep folders")

    def paper_inputs(p):
        p.add_argument("name", help="table1, table2, ... or fig1, fig2")
        p.add_argument("--out-dir", type=Path, default=Path("figures"))
        for role, what in (
            ("runs", "decode results at 1x, first shard"),
            ("scaled", "decode results at copy multipliers above 1"),
            ("bandwidth", "copy bandwidth results, this machine's first"),
            ("replay", "moecache replay results"),
            ("bound", "moecache bound results"),
            ("foresight", "moecache foresight results"),
            ("sweep", "moecache optimum-sweep results, or controller-sweep folders"),
            ("replication", "decode results at 1x, second shard"),
            ("gpu_check", "GPU check results (their bandwidth rows: more devices)"),
            ("learned", "moecache learned-evaluate results"),
            ("router", "moecache router-measure results"),
            ("longer", "moecache controller-longer folders"),
            ("controller", "controller heads files"),
            ("accuracy", "moecache accuracy summaries"),
        ):
            flag = "--" + role.replace("_", "-")
            p.add_argument(flag, nargs="*", type=Path, default=[], help=what)

    paper_inputs(command("table", cmd_table, "one of the paper's tables"))
    paper_inputs(command("figure", cmd_figure, "one of the paper's figures"))

    p = command(
        "numbers",
        cmd_numbers,
        "the measured numbers the README quotes, as marked blocks; refresh the README's",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", type=Path, help="a pipeline run's folder (results/, ...)")
    source.add_argument(
        "--from", dest="source", type=Path, help="the blocks of an earlier --out file"
    )
    p.add_argument("--shards", nargs="+", help="held-out shards in the config's order")
    p.add_argument("--runs", nargs="+", type=Path, help="runs at 1x (default: the first shard's)")
    p.add_argument("--bandwidth", nargs="+", type=Path, help="bandwidth files (default: all)")
    p.add_argument("--out", type=Path, help="write every section, marked, to this file")
    p.add_argument(
        "--readme", type=Path, nargs="+", help="replace the marked blocks of these files"
    )

    p = command(
        "claims",
        cmd_claims,
        "the reproduction scorecard: each of the paper's claims against a run's results",
    )
    p.add_argument("--workdir", type=Path, required=True, help="a run's folder (results/, ...)")
    p.add_argument("--shards", nargs="+", help="held-out shards in the config's order")
    p.add_argument("--out-dir", type=Path, help="write claims.{csv,md,sources.json} here")
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except MoecacheError as error:
        print(f"moecache: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
