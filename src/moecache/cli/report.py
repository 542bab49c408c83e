"""The report stage's commands: choose a policy, the paper's tables and figures, the numbers
the README quotes, the reproduction scorecard."""

from __future__ import annotations

from pathlib import Path

from moecache.cli.command import add, emit, results
from moecache.errors import MoecacheError

# Every input flag a table or figure may read; each reads just those its BUILDERS entry names.
INPUTS = (
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
    ("batched", "moecache decode-batched results"),
    ("tiers_grid", "moecache tiers-grid results"),
    ("tiers_measured", "moecache tiers-harness results"),
)


def flag(role: str) -> str:
    return "--" + role.replace("_", "-")


def cmd_choose(args):
    from moecache.costs import equation, overlap
    from moecache.records.bandwidth import BandwidthResult
    from moecache.records.io import read_dict, read_run_dict
    from moecache.report import choose

    if args.bandwidth is not None:
        bandwidth = read_dict(args.bandwidth, BandwidthResult)
        tau1 = equation.tau_1x(bandwidth)
    elif args.tau_ms is not None:
        tau1 = args.tau_ms
    else:
        raise MoecacheError("give --bandwidth FILE (moecache bandwidth) or --tau-ms")
    if args.tau_ms is not None:
        tau = args.tau_ms * args.multiplier
    else:
        # The copy time measured through the link m times slower, else m x tau(1).
        tau = equation.tau_at(bandwidth, args.multiplier, args.bandwidth, strict=False)
    reports = {path: read_run_dict(path) for path in args.runs}
    overlapped = [path for path, report in reports.items() if report.get("overlap")]
    if overlapped and not args.overlap:
        raise MoecacheError(
            f"--runs {overlapped[0]}: an overlapped run; --overlap ranks it by the overlap "
            "cost model (equation (1) prices blocking copies only)"
        )
    points = equation.read_points([p for p in args.runs if p not in overlapped], tau1)
    if args.overlap:
        points += overlap.choice_points(list(reports.values()), tau1)
    report = choose.choose_report(
        points, tau, args.max_loss, args.seed, args.include_baseline, args.bandwidth is None
    )
    lines = choose.choose_summary(report)
    emit(args, report, lines, [*args.runs, *([args.bandwidth] if args.bandwidth else [])])


def built(builders: dict, args, kind: str):
    """A table or figure from its builder, given the input flags it declares. A flag it
    does not read is refused: silently dropping it would hide a wrong rule or command."""
    if args.name not in builders:
        raise MoecacheError(f"unknown name {args.name!r} (known: {', '.join(sorted(builders))})")
    build, reads = builders[args.name]
    for role, _ in INPUTS:
        if role not in reads and getattr(args, role) is not None:
            raise MoecacheError(
                f"{kind} {args.name} does not read {flag(role)} "
                f"(it reads {', '.join(map(flag, reads))})"
            )
    # An input flag left out, or given with no files, is an empty list, as before.
    return build(**{role: getattr(args, role) or [] for role in reads})


def cmd_table(args):
    from moecache.report import tables

    table = built(tables.BUILDERS, args, "table")
    tables.write(table, args.out_dir)


def cmd_figure(args):
    from moecache.report import figures

    fig, sources = built(figures.BUILDERS, args, "figure")
    figures.write(args.name, fig, sources, args.out_dir)


def cmd_numbers(args):
    from moecache.report import numbers

    if args.source:
        sections, source = numbers.read_sections(args.source), str(args.source)
    else:
        sections = numbers.build(
            args.workdir, args.shards, args.runs, args.bandwidth, args.gpu_check
        )
        source = f"the results under {args.workdir}"
    if args.out:
        numbers.write(sections, args.out)
    if args.readme:
        # The scorecard's claims.csv beside the sections read: the README's summary block.
        claims = (args.source.parent if args.source else args.workdir / "figures") / "claims.csv"
        numbers.refresh(args.readme, sections, source, claims)
    if not (args.out or args.readme):
        print(numbers.render(sections), end="")


def cmd_claims(args):
    from moecache.report import claims

    rows = claims.scorecard(args.workdir, args.shards)
    if args.out_dir:
        claims.write(rows, args.out_dir, args.workdir)
    else:
        print(claims.render(rows))


def register(sub) -> None:
    register_choose(sub)
    for name, func, what in (
        ("table", cmd_table, "one of the paper's tables"),
        ("figure", cmd_figure, "one of the paper's figures"),
    ):
        p = add(sub, name, func, what)
        p.add_argument("name", help="table1, table2, ... or fig1, fig2")
        p.add_argument("--out-dir", type=Path, default=Path("figures"))
        for role, help in INPUTS:
            # None when not given, so that a flag the builder does not read can be refused.
            p.add_argument(flag(role), nargs="*", type=Path, help=help)
    register_numbers(sub)


def register_choose(sub) -> None:
    p = results(add(sub, "choose", cmd_choose, "the fastest policy within a loss limit"))
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
    p.add_argument(
        "--include-baseline",
        action="store_true",
        help="let the all-resident run (all) be chosen too",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="rank overlapped runs (overlap: true) too, by the overlap cost model; each "
        "needs the blocking run of its policy among --runs",
    )


def register_numbers(sub) -> None:
    p = add(
        sub,
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
    p.add_argument(
        "--gpu-check",
        nargs="*",
        type=Path,
        default=[],
        help="GPU check results, the devices report.devices names (default: none)",
    )
    p.add_argument("--out", type=Path, help="write every section, marked, to this file")
    p.add_argument(
        "--readme", type=Path, nargs="+", help="replace the marked blocks of these files"
    )

    p = add(
        sub,
        "claims",
        cmd_claims,
        "the reproduction scorecard: each of the paper's claims against a run's results",
    )
    p.add_argument("--workdir", type=Path, required=True, help="a run's folder (results/, ...)")
    p.add_argument("--shards", nargs="+", help="held-out shards in the config's order")
    p.add_argument("--out-dir", type=Path, help="write claims.{csv,md,sources.json} here")
