"""The README and docs/*.md document what a user meets: every `moecache` subcommand, every
top-level config key and every results folder the workflow writes is named somewhere in
them, every relative link resolves, and the README stays a few screens long."""

import argparse
import re
from pathlib import Path

import pytest
import yaml

from moecache import cli

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documentation() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def subcommands() -> list[str]:
    actions = cli.parser()._actions
    found = [a for a in actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(name for action in found for name in action.choices)


def config_keys() -> list[str]:
    return sorted(yaml.safe_load((REPO / "config/config.yaml").read_text()))


def results_folders() -> list[str]:
    rules = "\n".join(path.read_text() for path in (REPO / "workflow/rules").glob("*.smk"))
    return sorted(set(re.findall(r"results/([A-Za-z0-9_-]+)", rules)))


def test_the_walks_find_what_they_check():
    # An empty list would make the checks below pass on nothing.
    assert {"numbers", "table", "decode"} <= set(subcommands())
    assert {"harness", "replay", "seed"} <= set(config_keys())
    assert {"runs", "replay", "gates"} <= set(results_folders())


@pytest.mark.parametrize("name", subcommands())
def test_every_subcommand_is_documented(name):
    assert re.search(rf"`(moecache )?{re.escape(name)}[` ]", documentation()), (
        f"moecache {name}: named nowhere in README.md or docs/*.md (docs/command-line.md)"
    )


@pytest.mark.parametrize("key", config_keys())
def test_every_config_key_is_documented(key):
    assert re.search(rf"`{re.escape(key)}[`.:]", documentation()), (
        f"config key {key}: named nowhere in README.md or docs/*.md (docs/configuration.md)"
    )


@pytest.mark.parametrize("folder", results_folders())
def test_every_results_folder_is_documented(folder):
    assert f"results/{folder}/" in documentation(), (
        f"results/{folder}/: named nowhere in README.md or docs/*.md (docs/layout.md)"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to missing files: {', '.join(broken)}"


def test_the_readme_is_a_few_screens_and_names_the_test_command():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    # .ci/run runs `make test`, the README's test command; `make test` runs pytest.
    assert "make test" in text and "pytest" in text
    assert "make test" in (REPO / ".ci/run").read_text()
