"""The `moecache` command line: each pipeline stage is one subcommand; rules only call these.

Settings come either from a whole config file (`--config FILE`, validated in full) or, as
the Snakemake rules pass them, as JSON holding just the sections a stage reads
(`--settings JSON`), so a rule reruns only when its own sections change.

Each stage's subcommands live in a module of this package named for the stage
(`cli/replay.py`, ...), with what they share in `cli/command.py`; this module assembles them.
Nothing below the command line imports it: the stages hold no argparse.
"""

from __future__ import annotations

import argparse
import sys

from moecache.cli import (
    accuracy,
    controller,
    data,
    harness,
    learned,
    model,
    replay,
    replay_benchmarks,
    report,
    router_tuning,
    trace,
)
from moecache.cli.command import add
from moecache.errors import MoecacheError

# In the pipeline's order, which is the order `moecache --help` lists them in.
STAGES = (
    data,
    model,
    harness,
    replay,
    replay_benchmarks,
    trace,
    learned,
    router_tuning,
    controller,
    accuracy,
    report,
)


def cmd_validate_config(args):
    from moecache import config as configs  # jsonschema and yaml, for this command alone

    configs.load(args.file)
    print(f"{args.file}: valid")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="moecache", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    # The one command of no stage: it checks the config every stage reads.
    p = add(sub, "validate-config", cmd_validate_config, "check a config file against the schema")
    p.add_argument("file")
    for stage in STAGES:
        stage.register(sub)
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
