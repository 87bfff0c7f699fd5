# sandcell: every target sets up what it needs, so each works on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
BASE    ?=
EXTRA   ?=
export SANDCELL_IMAGE ?= sandcell-sandbox:latest

.PHONY: install engine image test unit bench demo lint clean

install: $(STAMP)
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,bench,ray]'
	touch $(STAMP)

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
	@status=0; \
	$(PY) scripts/testrun.py run $(REPORT) --rerun -- -n 4 --dist loadgroup -m 'not engine_outage' $(PYTEST_ARGS) || status=1; \
	echo "# the engine-outage tests stop the Docker engine for a few seconds: alone, after the rest"; \
	$(PY) scripts/testrun.py run $(basename $(REPORT))-outage.xml -- -m engine_outage $(PYTEST_ARGS) || status=1; \
	$(PY) scripts/testrun.py summary $(REPORT) $(basename $(REPORT))-outage.xml || status=1; \
	exit $$status

unit: install
	$(PY) -m pytest -m 'not docker' $(PYTEST_ARGS)

bench: install engine image
	@scripts/ensure-llama.sh $(PY)  # the real-server row; skipped, saying why, without it
	$(PY) -m bench $(BENCH_ARGS)

demo: install engine image
	$(PY) -m agent.cli.demo $(DEMO_ARGS)

lint: install
	$(VENV)/bin/ruff check sandbox agent tools images tests bench scripts
	$(VENV)/bin/ruff format --check sandbox agent tools images tests bench scripts

clean:
	rm -rf $(VENV)  # the image's wheels stay cached in ~/.cache/sandcell/image-wheels
