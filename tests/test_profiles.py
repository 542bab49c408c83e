"""The SLURM profile sends every rule that declares a GPU to the GPU partition."""

import re

import yaml
from conftest import REPO


def gpu_rules() -> set[str]:
    """Rules whose `resources:` declare a GPU, read from the rule files: gpu=1, or
    untimed_gpu() (one on a CUDA device, the one a cluster runs them on). A rule defined
    under an `if`, as harness.fan_out's two decode rules are, is indented."""
    found = set()
    for path in (REPO / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"\n(?= *rule )", path.read_text()):
            name = re.match(r" *rule (\w+):", block)
            if name and re.search(r"resources:\s*\n\s*gpu=(1|untimed_gpu\(\)),", block):
                found.add(name.group(1))
    return found


def test_gpu_rules_go_to_the_gpu_partition():
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    on_gpu = {
        rule
        for rule, resources in profile["set-resources"].items()
        if resources.get("slurm_partition") == "gpu"
    }
    rules = gpu_rules()
    assert {"gates", "decode", "probe_layers", "bandwidth", "profile_model"} <= rules
    assert rules == on_gpu
    assert profile["executor"] == "slurm"
    assert profile["default-resources"]["slurm_partition"] == "cpu"
    assert any(r.startswith("gpu=") for r in profile["resources"])
