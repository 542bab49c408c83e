# Two commands do everything on a fresh machine:  `make run`  and  `make test`.
# Both first build .venv at the repo root with the pinned dependencies (torch 2.13.0).
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTHON ?= python3

.PHONY: venv run test lint pytest clean

venv: $(STAMP)

$(STAMP): envs/requirements.txt envs/requirements-dev.txt envs/constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip==26.3
	$(VENV)/bin/pip install --quiet -r envs/requirements.txt -r envs/requirements-dev.txt \
		-c envs/constraints.txt
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# The main job: the whole DAG on the embedded default config, then its HTML report.
run: venv
	snakemake all --cores 1 --resources gpu=1
	snakemake --report report.html

# The test suite: static checks, then the tests (which include the smoke pipeline).
test: venv lint pytest

lint: venv
	ruff check src tests
	ruff format --check src tests
	snakefmt --check Snakefile workflow
	snakemake --lint --configfile config/smoke.yaml

pytest: venv
	pytest

clean:
	rm -rf results logs benchmarks .snakemake
