# Two commands for a fresh machine: `make demo` and `make test` (see README).
# PYTHON=python3.12 picks the interpreter (3.11, 3.12 or 3.13; by default
# VENV's own, else the first supported of python3, python3.13, python3.12,
# python3.11, pyenv's included); GPU=1 installs TensorFlow for CUDA 12.
PYTHON ?=
GPU ?= 0
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= /tmp/fl_papers_demo

.PHONY: install demo test test-settings bench bench-small bench-large bench-gpu bazel-test reproduce reproduce-smoke paper-smoke clean

# requirements/install.sh: the lock file with --no-deps, the fixes of
# requirements/fix_dependencies.py, this package; returns at once when VENV
# already holds that install.
install:
	@PYTHON='$(PYTHON)' GPU='$(GPU)' sh requirements/install.sh $(VENV)

demo: install
	$(PY) run_experiment.py --task=synthetic --total_rounds=30 \
	  --clients_per_round=10 --rounds_per_eval=10 \
	  --root_output_dir=$(DEMO_DIR) --experiment_name=demo

# Test modules run on TEST_JOBS processes (pytest-xdist, a module's tests
# together: each module starts its own TFF worker, ~1.5 GB per process), in
# the order tests/conftest.py gives them (longest first). PYTEST_FLAGS adds
# pytest flags. TEST_RUNNER=bazel runs the same modules as Bazel targets
# instead (`make bazel-test`, one target per module, a line per target): what
# CI runs, so that every target is seen to pass and no module runs twice.
TEST_RUNNER ?= pytest
TEST_JOBS ?= 2
PYTEST_FLAGS ?=
test: test-settings install
ifeq ($(TEST_RUNNER),bazel)
	@$(MAKE) --no-print-directory bazel-test
else
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
	  --durations=60 $(PYTEST_FLAGS) tests
endif

# Before the install: a runner that does not exist, or flags for the runner
# not chosen (they would do nothing), is one error line.
test-settings:
	@case '$(TEST_RUNNER)' in \
	  pytest) [ -z '$(BAZEL_TEST_FLAGS)' ] || { echo 'error: BAZEL_TEST_FLAGS' \
	    'does nothing with TEST_RUNNER=pytest (PYTEST_FLAGS is pytest'"'"'s)' >&2; \
	    exit 2; } ;; \
	  bazel) [ -z '$(PYTEST_FLAGS)' ] || { echo 'error: PYTEST_FLAGS does' \
	    'nothing with TEST_RUNNER=bazel (BAZEL_TEST_FLAGS is bazel'"'"'s)' >&2; \
	    exit 2; } ;; \
	  *) echo "error: TEST_RUNNER must be pytest or bazel, got" \
	    "'$(TEST_RUNNER)'" >&2; exit 2 ;; \
	esac

# Writes the latest figures to results/bench/ (README.md is the report).
BENCH_DIR := results/bench
bench: install
	{ echo '$$ python -m bench.round_time --output=$(BENCH_DIR)/bench.json'; \
	  $(PY) -m bench.round_time --output=$(BENCH_DIR)/bench.json; \
	} > $(BENCH_DIR)/bench_run.log.tmp
	mv $(BENCH_DIR)/bench_run.log.tmp $(BENCH_DIR)/bench_run.log
	$(PY) -m bench.report $(BENCH_DIR)/bench_run.log $(BENCH_DIR)/README.md
	cat $(BENCH_DIR)/README.md

# The papers' tables and figures at the local scale (hours on 2 cores): run
# directories under REPRODUCE_ROOT, reports in results/<paper>/<experiment>/
# beside their finished runs (local_confirmatory.tar.xz, --runs_archive: a
# pass cut off resumes from them on another machine).
REPRODUCE_ROOT ?= /tmp/fl_papers/reproduce
# The small-model rows and the end-to-end Synthetic run only (~5 min): the
# TFF, fused and limit rounds of emnist_linear and synthetic_lr.
bench-small: install
	mkdir -p $(BENCH_DIR)/small_models
	{ echo '$$ python -m bench.round_time --sections=ratios,e2e --workloads= --output=$(BENCH_DIR)/small_models/bench.json'; \
	  $(PY) -m bench.round_time --sections=ratios,e2e --workloads= \
	    --output=$(BENCH_DIR)/small_models/bench.json; \
	} > $(BENCH_DIR)/small_models/bench_run.log.tmp
	mv $(BENCH_DIR)/small_models/bench_run.log.tmp $(BENCH_DIR)/small_models/bench_run.log
	$(PY) -m bench.report $(BENCH_DIR)/small_models/bench_run.log $(BENCH_DIR)/small_models/README.md bench-small
	cat $(BENCH_DIR)/small_models/README.md

# The CNN and LSTM rows at 10 clients only (~10 min): the worker's rounds and
# the in-process `local` column side by side.
bench-large: install
	mkdir -p $(BENCH_DIR)/large_models
	{ echo '$$ python -m bench.round_time --sections=ratios --small_model_workloads= --cohorts=10 --repeats=2 --output=$(BENCH_DIR)/large_models/bench.json'; \
	  $(PY) -m bench.round_time --sections=ratios --small_model_workloads= \
	    --cohorts=10 --repeats=2 --output=$(BENCH_DIR)/large_models/bench.json; \
	} > $(BENCH_DIR)/large_models/bench_run.log.tmp
	mv $(BENCH_DIR)/large_models/bench_run.log.tmp $(BENCH_DIR)/large_models/bench_run.log
	$(PY) -m bench.report $(BENCH_DIR)/large_models/bench_run.log $(BENCH_DIR)/large_models/README.md bench-large
	cat $(BENCH_DIR)/large_models/README.md

# The in-process runtime's rounds on the CPU cores and on each visible GPU
# (results/bench/gpu/README.md); with no GPU, the CPU only. BENCH_GPU_FLAGS
# shrinks it (CI: a few clients, one round).
BENCH_GPU_FLAGS ?=
bench-gpu: install
	$(PY) -m bench.gpu $(BENCH_GPU_FLAGS)

# The confirmatory pass: every frozen protocol on its confirmatory seeds.
reproduce: install
	$(PY) -m reproduce all --scale=local --phase=confirmatory \
	  --root_output_dir=$(REPRODUCE_ROOT) --runs_archive=results

# Every experiment for two rounds, one seed (CI), exploratory: runs, analyses
# and reports in a fresh temporary directory; then the confirmatory path on a
# tiny protocol (GeL's Figure 2 copied there): freeze, confirmatory run with
# its runs archived (--runs_archive), report; then, the run directories
# gone, the same report again from the archive alone.
reproduce-smoke: install
	root=$$(mktemp -d) && \
	  { $(PY) -m reproduce all --scale=smoke --root_output_dir=$$root && \
	    mkdir -p $$root/protocols/gel && \
	    cp reproduce/protocols/gel/fig2.toml $$root/protocols/gel/ && \
	    $(PY) -m reproduce freeze gel fig2 --protocols_dir=$$root/protocols && \
	    confirm="gel fig2 --scale=smoke --phase=confirmatory \
	      --protocols_dir=$$root/protocols --root_output_dir=$$root \
	      --report_dir=$$root/reports --runs_archive=$$root/archive" && \
	    $(PY) -m reproduce $$confirm && \
	    mv $$root/reports/gel/fig2/README.md $$root/first.md && \
	    rm -rf $$root/gel && \
	    $(PY) -m reproduce $$confirm --report_only && \
	    cmp $$root/first.md $$root/reports/gel/fig2/README.md && \
	    echo "runs_archive: the report regenerated from the archive alone" \
	      "is the same"; \
	  } > $$root.log 2>&1; status=$$?; \
	  grep -E '^(==|sweep:|report:|frozen:|error:|failed:|runs_archive:|/)' \
	    $$root.log; \
	  rm -rf $$root $$root.log; exit $$status

# The paper scale, kept from rotting (CI): per experiment, the first point of
# every paper-scale grid (each shape of command once: first points that
# differ only in numbers run one), one round on the tasks' stand-in data,
# no report (`--scale=paper_smoke`, docs/cluster.md); the large-cohort
# paper's through --launcher=slurm on a one-node cluster
# (tools/local_slurm.sh; root needed), the others here. SLURM's jobs are
# fresh processes, each importing TensorFlow, so the paper with the fewest
# points goes there.
paper-smoke: install
	root=$$(mktemp -d) && \
	  { $(PY) -m reproduce adabest --scale=paper_smoke \
	      --root_output_dir=$$root && \
	    $(PY) -m reproduce gel --scale=paper_smoke \
	      --root_output_dir=$$root && \
	    eval "$$(tools/local_slurm.sh start $$root/slurm)" && \
	    ( $(PY) -m reproduce large_cohort --scale=paper_smoke \
	        --launcher=slurm --wait --poll_seconds=5 --cpus_per_run=1 \
	        --mem_gb=2 --root_output_dir=$$root; cohort=$$?; \
	      tools/local_slurm.sh stop $$root/slurm; exit $$cohort ); \
	  } > $$root.log 2>&1; status=$$?; \
	  grep -E '^(==|sweep:|large_cohort |error:|failed:|  failed:|    \|)' \
	    $$root.log; \
	  rm -rf $$root $$root.log; exit $$status

# Bazel: Debian's bazel-bootstrap 4.2.3 plus the offline stand-ins of the rule
# repositories it would download (WORKSPACE); apt only when one is missing.
BAZEL_DEBS := bazel-bootstrap bazel-bootstrap-source
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# Extra `bazel test` flags, e.g. BAZEL_TEST_FLAGS=--test_env=NAME (.ci/run).
BAZEL_TEST_FLAGS ?=

bazel-test: install
	@missing=$$(for p in $(BAZEL_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' \
	    || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing $$missing"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $$missing; \
	fi
	bazel test $(BAZEL_TEST_FLAGS) //...

clean:
	rm -rf $(VENV) *.egg-info
