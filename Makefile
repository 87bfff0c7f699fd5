# sandcell: every target sets up what it needs, so each works on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
BASE    ?=
EXTRA   ?=
export SANDCELL_IMAGE ?= sandcell-sandbox:latest

.PHONY: install engine image test unit bench demo lint clean FORCE

# An editable install in setuptools' strict mode: a tree of links to the clone's files under
# build/, which a type checker follows (the default mode's import hook maps folders to names at
# run time, and mypy cannot see through it). A module added or removed needs the links made
# anew: the stamp's name carries a checksum of the package folders' file names (an edit changes
# nothing), and a missing link tree (build/ removed) installs again.
LINKED  := $(shell find src sandbox tools agent images -type f -not -path '*/__pycache__/*' 2>/dev/null | LC_ALL=C sort | cksum | cut -d' ' -f1)
STAMP   := $(VENV)/.installed-$(LINKED)
install: $(STAMP)
$(STAMP): pyproject.toml constraints.txt $(if $(wildcard build/__editable__.*),,FORCE)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		--config-settings editable_mode=strict -e '.[test,bench,ray,otel]'
	rm -f $(VENV)/.installed*
	touch $(STAMP)

FORCE:

engine:  # RUNTIME=runsc: install gVisor's runsc too and register it with the engine
	@RUNTIME=$(RUNTIME) scripts/ensure-docker.sh

image: install engine  # EXTRA=path/to/requirements.txt: more packages, downloaded here as wheels
	@$(VENV)/bin/sandcell image build $(if $(BASE),--base $(BASE)) $(if $(EXTRA),--extra $(EXTRA))

# the sandbox suites run under runc and under gVisor (`make test RUNTIME=` leaves gVisor out).
# scripts/testrun.py runs each failed test of the parallel suite once more, alone: one that then
# passes is reported flaky (and listed in tests/FLAKY.md), one that fails again fails the run.
# The summary, last, reads the JUnit reports (JUNIT=path names the first; .test-report.xml).
test: RUNTIME ?= runsc
test: REPORT = $(or $(JUNIT),.test-report.xml)
test: install engine image
	@scripts/ensure-chromium.sh  # the page's browser tests: Debian's chromium, never a download
	@scripts/ensure-llama.sh $(PY)  # the realmodel tests' server: built once per machine, cached
	@scripts/ensure-podman.sh  # Podman's Docker API and the image, for the tests run against it
	@scripts/ensure-test-hosts.sh  # the --allow-net tests' host names, before any worker starts
	@scripts/ensure-prometheus.sh  # Debian's prometheus, for the metrics tests to start and scrape with
	@status=0; \
	$(PY) scripts/testrun.py run $(REPORT) --rerun -- -n 4 --dist loadgroup -m 'not engine_outage' $(PYTEST_ARGS) || status=1; \
	echo "# the engine-outage tests stop the Docker engine for a few seconds: alone, after the rest"; \
	$(PY) scripts/testrun.py run $(basename $(REPORT))-outage.xml -- -m engine_outage $(PYTEST_ARGS) || status=1; \
	$(PY) scripts/testrun.py summary $(REPORT) $(basename $(REPORT))-outage.xml || status=1; \
	exit $$status

# The fast tier: every test that needs no Docker engine, no browser, no wheel build and no
# model server, in parallel. For a quick answer while you work; `make test` before you push.
unit: install
	$(PY) -m pytest -n auto -m 'not docker and not browser and not wheel and not realmodel and not engine_outage' $(PYTEST_ARGS)

bench: install engine image
	@scripts/ensure-llama.sh $(PY)  # the real-server row; skipped, saying why, without it
	$(PY) -m bench $(BENCH_ARGS)

demo: install engine image
	$(PY) -m sandcell.agent.cli.demo $(DEMO_ARGS)

# ruff first (seconds), then mypy over the installed package by its import name, never the
# folders by path (each module would have two names). mypy's cache stays in .mypy_cache.
LINTED := src sandbox agent tools images tests bench scripts
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy -p sandcell

clean:  # the editable install's links go with the venv that points at them
	rm -rf $(VENV) build/__editable__.*  # the image's wheels stay cached in ~/.cache/sandcell/image-wheels
