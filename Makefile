# ASO's one entry point for set-up, running and checking. Every install step lives here or in
# deploy/*.sh: a fresh Debian machine needs nothing else. Targets a user needs:
#   make run    set up, then run the service on its embedded defaults (foreground)
#   make demo   while `make run` runs: 200 real files through the pipeline
#   make test   set up, then run the linter and the test suite on both stores (what CI runs)
#   make test-fast  the tests that need no real store: aso/core's decisions, layout, docs, and
#               the agents' cycles on the in-memory store (tests/memstore.py; ~30 s)
#   make stop   stop what `make run` started
#   make bench  the scalability benchmark: the simulator at 2x, 4x, 8x design load (~13 min;
#               STORE=couchdb or STORE=both for CouchDB)
#   make fuzz   the hostile-input suite's long run (~15 min; `make test` runs a bounded one)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV   := .venv
ASO    := $(VENV)/bin/aso
STAMPS := .stamps
POUCHDB_SERVER := deploy/store/node_modules/.bin/pouchdb-server
CONFIG ?= aso.toml

# Apache CouchDB 3 for the suite's CouchDB leg and benchmarks on CouchDB (STORE=couchdb). Where
# this checkout sits beside ../shared/couchdb (the project's workspace), its release is installed
# into .cache/ (idempotent, seconds). Elsewhere point COUCHDB_HOME at an installed CouchDB
# (Apache's packages put it in /opt/couchdb, the default). Only the test and benchmark set-up
# looks at ../shared: ASO itself finds CouchDB by couchdb.home or $COUCHDB_HOME.
SHARED_COUCHDB := ../shared/couchdb
CACHED_COUCHDB := $(CURDIR)/.cache/couchdb-3.4.3
ifneq ($(wildcard $(SHARED_COUCHDB)/install.sh),)
COUCHDB_HOME ?= $(CACHED_COUCHDB)
else
COUCHDB_HOME ?= /opt/couchdb
endif
export COUCHDB_HOME
# The store the benchmarks run on: pouchdb (the embedded store), couchdb, or both.
STORE ?= pouchdb
# Screenshots of the monitoring pages (tests/browser_helpers.py): a folder per store, emptied
# when that store's leg starts and kept afterwards, passed or not, for CI to collect
# (docs/testing.md, "Screenshots of the monitoring pages").
ASO_TEST_ARTEFACTS := $(or $(ASO_TEST_ARTEFACTS),$(CURDIR)/test-artefacts)
export ASO_TEST_ARTEFACTS
, := ,
space := $(subst ,, )
# The stores a benchmark runs on: both for STORE=both, the one STORE names when given, and when
# STORE is not given the benchmark's own default ($(1)) or STORE's (pouchdb).
engines = $(if $(filter both,$(STORE)),pouchdb couchdb,$(if $(filter command line environment,$(origin STORE)),$(STORE),$(or $(1),$(STORE))))
comma_list = $(subst $(space),$(,),$(strip $(1)))

.PHONY: help setup couchdb run demo stop test test-fast test-couchdb test-pouchdb test-spidermonkey lint fuzz chaos chaos-cluster soak bench bench-scale bench-long bench-uploads bench-workqueue bench-frontend bench-locust bench-pages bench-metrics bench-views clean

help:
	@echo "make run    - set up and run ASO on its embedded defaults (store, storage, agents; Ctrl-C stops)"
	@echo "make demo   - while 'make run' runs: write 200 files at two sites and follow their transfers"
	@echo "              (FREEZE=SITE: that site's XRootD frozen for 60 s 10 s in, and how long files waited)"
	@echo "make test   - set up and run the linter and the test suite on CouchDB and pouchdb-server at once"
	@echo "make test-couchdb / test-pouchdb - the suite on one store only"
	@echo "make test-fast - the tests that need no real store: the agents' decisions and cycles (on"
	@echo "              an in-memory store running the store's JavaScript), layout, docs (~30 s)"
	@echo "make stop   - stop what 'make run' started"
	@echo "make bench  - the simulator at 2x, 4x and 8x design load (prints figures; ~13 min);"
	@echo "              STORE=couchdb on a local CouchDB, STORE=both side by side"
	@echo "make bench-long - 20x (embedded) and 30x (CouchDB) for 30 min, fresh and with 1M requests"
	@echo "              in the store, with that store's costs (~4 h; STORE=both for both stores)"
	@echo "make bench-uploads - job uploads a store takes at 2, 8, 32 uploaders, and their CPU (~2 min)"
	@echo "make fuzz   - the hostile-input suite with many more generated cases (~15 min)"
	@echo "make chaos  - 4x design with agents, store and storage failing; a host killed; then"
	@echo "              make chaos-cluster: CouchDB nodes killed under short leases (~50 min)"
	@echo "make soak   - one simulated hour at 4x: memory and open files per process (~35 min)"
	@echo "make clean  - remove the virtual environment and installed Node packages (keeps var/)"

setup: $(STAMPS)/system $(POUCHDB_SERVER) $(ASO)

$(STAMPS)/system: deploy/install-system.sh deploy/debian-packages.txt
	deploy/install-system.sh
	@mkdir -p $(STAMPS) && touch $@

# pouchdb-server, exactly as pinned by the committed lock file. Install scripts are not run:
# leveldown loads the prebuilt binary it ships, and the optional sqlite3 back end is unused.
$(POUCHDB_SERVER): deploy/store/package.json deploy/store/package-lock.json $(STAMPS)/system
	cd deploy/store && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@

# CouchDB from ../shared/couchdb into .cache/ when this checkout has it; nothing otherwise.
couchdb:
	@if [ "$(COUCHDB_HOME)" = "$(CACHED_COUCHDB)" ]; then \
	  $(SHARED_COUCHDB)/install.sh "$(CACHED_COUCHDB)"; fi

$(ASO): setup.cfg pyproject.toml deploy/python-constraints.txt deploy/install-python.sh $(STAMPS)/system
	deploy/install-python.sh
	@touch $@

run: setup
	$(ASO) config init $(CONFIG) --if-missing
	@echo "Starting ASO (Ctrl-C stops it). In another terminal: 'make demo' moves 200 real files."
	$(ASO) --config $(CONFIG) run

demo: $(ASO)
	$(ASO) --config $(CONFIG) demo --files 200 $(if $(FREEZE),--freeze $(FREEZE))

# A `make run` of this checkout still running would start again what is stopped under it: it
# is asked to stop first (SIGTERM: it stops its agents, storage and store; waited for until it
# has exited, a zombie counting as exited), then whatever it left behind.
stop:
	@if [ ! -x $(ASO) ] || [ ! -f $(CONFIG) ]; then echo "nothing to stop"; exit 0; fi; \
	for pid in $$(pgrep -f -- "^[^ ]*python[0-9.]* [^ ]*aso --config $(CONFIG) run( |$$)" || true); do \
	  if [ "$$(readlink /proc/$$pid/cwd)" = "$(CURDIR)" ]; then \
	    echo "stopping aso run (pid $$pid)"; kill -TERM $$pid; \
	    for i in $$(seq 120); do grep -qs '^State:[[:space:]]*[A-Y]' /proc/$$pid/status || break; sleep 0.5; done; fi; \
	done; \
	$(ASO) --config $(CONFIG) storage stop; $(ASO) --config $(CONFIG) store stop

lint: $(ASO)
	$(VENV)/bin/ruff check aso agents sim tests docs/client-example.py
	$(VENV)/bin/ruff format --check aso agents sim tests docs/client-example.py
	$(VENV)/bin/mypy aso

# The whole suite on each store, both legs at once (the tests mostly wait on stores, agents and
# storage servers, so two legs share the 2 cores well: ~25 min where one after the other took
# ~40), each line prefixed with its store and kept whole in var/test-<store>.log; the run fails
# if either leg fails, and ends by repeating each leg's failures (a CI log may keep only its
# tail). Under CI (CI=true) a missing CouchDB fails the run; elsewhere it is said loudly and
# only the embedded leg runs.
test: setup lint couchdb
	@legs=pouchdb; \
	if [ -x "$(COUCHDB_HOME)/bin/couchdb" ]; then legs="couchdb pouchdb"; \
	elif [ "$${CI:-}" = "true" ]; then \
	  echo "make test: no Apache CouchDB at $(COUCHDB_HOME) (COUCHDB_HOME): CI runs the suite on both stores" >&2; exit 1; \
	else \
	  echo "make test: WARNING: no Apache CouchDB at $(COUCHDB_HOME); the CouchDB leg is NOT run (set COUCHDB_HOME)" >&2; fi; \
	start=$$(date +%s); pids=(); \
	mkdir -p var; for leg in $$legs; do \
	  ( $(MAKE) --no-print-directory test-$$leg 2>&1 | tee var/test-$$leg.log | sed -u "s/^/[$$leg] /" ) & pids+=($$!); done; \
	failed=0; for pid in "$${pids[@]}"; do wait $$pid || failed=1; done; \
	for leg in $$legs; do grep -E '^(FAILED|ERROR) |^(make|==).*(FAILED|Error)' var/test-$$leg.log \
	  | sed "s/^/== failed on $$leg: /" || true; done; \
	echo "== screenshots of the monitoring pages, a folder per store: $(ASO_TEST_ARTEFACTS)/"; \
	echo "== make test: $$( [ $$failed = 0 ] && echo passed || echo FAILED ) in $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s ($$legs)"; \
	exit $$failed

# The tests that need no store, storage or service: the decisions of aso/core/, the layout,
# the model and configuration, the docs, and the agents' cycles on the in-memory store that runs
# the store's own JavaScript (tests/memstore.py; a minute at most; `make test` runs them on
# each leg).
FAST_TESTS := tests/test_core.py tests/test_layout.py tests/test_model_config.py tests/test_docs.py tests/test_rules.py \
	tests/test_agents_fast.py
test-fast: setup
	@start=$$(date +%s); $(VENV)/bin/pytest $(FAST_TESTS) && \
	  echo "== the fast tier passed in $$(( $$(date +%s) - start )) s"

test-couchdb test-pouchdb: test-%: setup
	@echo "== the test suite on $* ($$(date +%T))"
	@rm -rf "$(ASO_TEST_ARTEFACTS)/$*"
	@trap 'echo "== screenshots of the monitoring pages on $*: $(ASO_TEST_ARTEFACTS)/$*/"' EXIT; \
	  start=$$(date +%s); ASO_TEST_STORE=$* $(VENV)/bin/pytest $(PYTEST_ARGS); \
	  echo "== the suite on $* passed in $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s"
	@if [ "$*" = couchdb ] && [ -z "$(PYTEST_ARGS)" ]; then $(MAKE) --no-print-directory test-spidermonkey; fi

# The suite's CouchDB leg runs on QuickJS (couchdb.js_engine, ASO's default); the tests of the
# store's own JavaScript (validation, every view, the work queue, status) run again on
# SpiderMonkey, CouchDB's default: ASO's functions must work on both (~1 min).
JS_TESTS := tests/test_validation.py tests/test_store.py tests/test_workqueue.py \
	tests/test_status.py
test-spidermonkey: setup
	@echo "== the store's JavaScript on CouchDB with spidermonkey ($$(date +%T))"
	ASO_TEST_STORE=couchdb ASO_TEST_JS_ENGINE=spidermonkey $(VENV)/bin/pytest $(JS_TESTS)

# tests/test_hostile.py with the "long" Hypothesis profile (tests/hostile_strategies.py): random
# instead of derandomized, ASO_HYPOTHESIS_EXAMPLES per property (600), failures kept in
# var/hypothesis and tried first next time. No per-test timeout: a property runs for minutes.
fuzz: setup
	ASO_HYPOTHESIS_PROFILE=long $(VENV)/bin/pytest tests/test_hostile.py tests/test_boundary.py --timeout=0 \
		--hypothesis-show-statistics --durations=0

# The lifecycle simulator at 2x, 4x and 8x design load, each on a fresh store with every agent
# (sim/bench_scale.py; plots to docs/bench/). The other benchmarks have targets of their own.
bench: bench-scale

# STORE=couchdb runs it on a local CouchDB ($(COUCHDB_HOME)), STORE=both on each store back to
# back, scale by scale, with a side-by-side table.
bench-scale: setup couchdb
	$(VENV)/bin/python -m aso.sim.bench_scale --engines $(call comma_list,$(call engines)) $(BENCH_ARGS)

# Issue 22's goal scales (20x on the embedded store, 30x on CouchDB) over a 30-minute injection
# window, on a fresh store and on a copy of one holding 1M finished requests (filled once into
# var/bench-pages, as make bench-pages does), with the store's costs at that size (~4 h both
# stores, the default; STORE=pouchdb or couchdb for one; BENCH_ARGS="--duration 5m --prefill 100000" short).
bench-long: setup couchdb
	$(VENV)/bin/python -m aso.sim.bench_long --engines $(call comma_list,$(call engines,pouchdb couchdb)) $(BENCH_ARGS)

# Job uploads (one call per job, as job wrappers make them) that a store of its own takes at
# 2, 8 and 32 concurrent uploaders with nothing else running, and their CPU (store, its
# JavaScript, the client): what 30x design's 74 uploads/s ask of this machine (~2 min each
# store; STORE=couchdb by default, STORE=both side by side).
bench-uploads: setup couchdb
	@for engine in $(call engines,couchdb); do \
	  $(VENV)/bin/python -m aso.sim.bench_uploads --engine $$engine --workdir var/bench-uploads/$$engine $(BENCH_ARGS) || exit 1; done

bench-workqueue: setup
	$(VENV)/bin/python -m aso.sim.bench_workqueue

# The embedded store's view builds with pouchdb-mapreduce's own evaluation and with ASO's
# workaround (deploy/store/view-functions.js), side by side.
bench-views: setup
	$(VENV)/bin/python -m aso.sim.bench_views $(BENCH_ARGS)

# What the Prometheus metrics cost a store call: the same calls with the hook on and off.
bench-metrics: setup
	$(VENV)/bin/python -m aso.sim.bench_metrics --rounds 30

bench-frontend: setup
	$(VENV)/bin/python -m aso.sim.bench_frontend

# Locust against the X.509 front end: job wrappers uploading, CRAB clients polling (50 users, 60 s).
bench-locust: setup
	$(VENV)/bin/python -m aso.sim.bench_locust

# The monitoring pages with 1M requests in the store (the filled store is kept in var/).
bench-pages: setup couchdb
	$(VENV)/bin/python -m aso.sim.bench_pages --engines $(call comma_list,$(call engines)) $(BENCH_ARGS)

# Chaos at 4x design (docs/testing.md: Chaos, soak and failures): agents killed every 5 s, the store
# killed and restarted twice, a storage outage and a failing link; then two agent hosts, one
# killed midway. Each prints the exact accounting and exits 1 if anything was lost.
chaos: setup couchdb
	rm -rf var/sim/chaos var/sim/hosts
	$(VENV)/bin/aso sim --scale 4 --duration 5m --interval 10s --block-timeout 60 --chaos \
	  --workdir var/sim/chaos
	$(VENV)/bin/aso sim --scale 4 --duration 5m --interval 10s --block-timeout 60 --hosts 2 \
	  --kill-host sim2 --workdir var/sim/hosts
	$(MAKE) --no-print-directory chaos-cluster

# The cluster cases of `make chaos` (no file copied twice at once, whatever the lease and whichever
# node dies): node 2 killed with a 20 s and a 10 s lease, nodes 2 then 3 killed.
CLUSTER_SIM = $(VENV)/bin/aso sim --scale 4 --duration 4m --interval 10s --engine couchdb --nodes 3 \
	--hosts 3 --block-timeout 30 --retry-delay 10 --no-ceiling --seed 42 --users 300 --sites 90
chaos-cluster: setup couchdb
	rm -rf var/sim/cluster-*
	$(CLUSTER_SIM) --kill-node 2 --lease 20s --workdir var/sim/cluster-lease20
	$(CLUSTER_SIM) --kill-node 2 --lease 10s --workdir var/sim/cluster-lease10
	$(CLUSTER_SIM) --kill-node 2 --kill-node 3 --lease 10s --workdir var/sim/cluster-two-nodes

# One simulated hour at 4x design, twice as fast as real time (30 min): memory and open files
# of every process at the start, middle and end (report.json: resources).
soak: setup
	rm -rf var/sim/soak
	$(VENV)/bin/aso sim --scale 4 --duration 1h --compression 2 --workdir var/sim/soak

clean:
	rm -rf $(VENV) $(STAMPS) deploy/store/node_modules .cache
