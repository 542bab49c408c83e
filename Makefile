# Two commands do everything on a fresh machine:  `make run`  and  `make test`; a third,
# `make publish`, copies a finished run into docs/results/ for you to commit. Each first
# builds .venv at the repo root with the pinned dependencies (torch 2.13.0).
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTHON ?= python3

.PHONY: venv run publish test lint pytest gpu-check replay-scale clean

venv: $(STAMP)

$(STAMP): envs/requirements.txt envs/requirements-dev.txt envs/constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip==26.3
	$(VENV)/bin/pip install --quiet -r envs/requirements.txt -r envs/requirements-dev.txt \
		-c envs/constraints.txt
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# The main job: the whole DAG on the embedded default config, then its HTML report. Its
# outputs (results/, figures/, report.html) are ignored by git: it leaves tracked files alone.
run: venv
	snakemake all --cores all --resources gpu=1
	snakemake --report report.html

# Publish a finished run: its final tables, figures and numbers from figures/ into
# docs/results/, then the marked number blocks of the README and docs/*.md from them.
PUBLISHED := docs/results
publish: venv
	test -f figures/numbers.md || { echo "figures/numbers.md: missing (make run first)" >&2; exit 1; }
	find figures -maxdepth 1 -type f ! -name README.md -exec cp {} $(PUBLISHED)/ \;
	moecache numbers --from $(PUBLISHED)/numbers.md --readme README.md docs/*.md

# The test suite: static checks, then the tests (which include the smoke pipeline).
test: venv lint pytest

lint: venv
	ruff check src tests
	ruff format --check src tests
	snakefmt --check Snakefile workflow
	snakemake --lint --configfile config/smoke.yaml

pytest: venv
	pytest -n auto --dist loadgroup

# One GPU, under eight minutes (a part past the budget is skipped and named), nothing
# downloaded: the smoke model through the gates in float32 and bfloat16, copy bandwidth per
# multiplier, a paper-sized expert layer, OLMoE-1B-7B's shapes (4 layers) and a GPT-OSS with
# MXFP4 experts loaded through the real path: the accountant's peaks against the allocator's
# and the plan's (more than 5% off the plan fails), LRU blocking against overlapped at 1x and
# 10x (docs/gpu-check.md). One results file per machine, measured/gpu-check/<host>.json:
# Table 1 and the numbers read it once config key report.devices names <host> (commit it
# beside the H200's). Without CUDA it refuses in one line.
gpu-check: venv
	moecache gpu-check --out measured/gpu-check/$$(hostname).json

# Every rule over a generated trace of 100 million requests (400 sequences x 1000 tokens x
# 32 layers x top-8 of 64), streamed: seconds per rule and peak memory. Minutes of CPU, so
# not part of `all`; the result is committed under measured/.
REPLAY_SCALE ?= --sequences 400 --tokens 1000 --layers 32
replay-scale: venv
	moecache benchmark-replay-scale $(REPLAY_SCALE) --out measured/replay-scale/$$(hostname).json

clean:
	rm -rf results logs benchmarks .snakemake
