"""The conda environment pins exactly what envs/requirements.txt pins."""

import re

import yaml
from conftest import REPO


def pins(lines):
    return {line.strip() for line in lines if re.match(r"^[A-Za-z0-9_.-]+==", line.strip())}


def test_conda_env_matches_requirements():
    env = yaml.safe_load((REPO / "envs" / "moecache.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    requirements = (REPO / "envs" / "requirements.txt").read_text().splitlines()
    assert pins(pip_section) == pins(requirements)
    assert "torch==2.13.0" in pins(requirements)
