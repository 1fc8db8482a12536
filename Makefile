# Two commands for a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= /tmp/fl_papers_demo

.PHONY: install demo test bench clean

install: $(STAMP)

# TFF 0.87.0 pins jax/jaxlib 0.4.14, whose wheels are gone: the lock file holds
# every TFF dependency with jax/jaxlib 0.4.13 instead, and TFF goes in --no-deps.
$(STAMP): requirements/lock.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps tensorflow-federated==0.87.0
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) run_experiment.py --task=synthetic --total_rounds=30 \
	  --clients_per_round=10 --rounds_per_eval=10 \
	  --root_output_dir=$(DEMO_DIR) --experiment_name=demo

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m bench.round_time

clean:
	rm -rf $(VENV) *.egg-info
