# distributed-lock-lab: every target a newcomer needs. `make help` lists them.
SHELL := /bin/bash
GO    ?= go
PKGS  := ./...
BIN   := bin
# The Go SDK's own modules (docs/adr/0003-sdk-module.md). `go test ./...`
# at the root does not enter a nested module, so test, lint and fuzz run
# in each too, alone: GOWORK=off, its own go.mod only, as a caller builds it.
SDK_MODS := lockserver/api lockserver/client

.PHONY: help test test-full fuzz lint fmt build docs docs-serve bench bench-contended bench-e2e bench-e2e-creators up demo explore soak gameday month failover partitions clean plan deploy destroy

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-19s %s\n", $$1, $$2}'

# Three packages at a time on two cores: most of the slow packages wait on
# PostgreSQL clusters and child processes, and at the default of one per
# core the suite left a quarter of the CPU idle (12.5 min against 10 min).
# go test starts packages in the order named, so the slowest (minutes each)
# are named first: started last, they would run on alone at the end.
SLOW_PKGS := ./lockserver/store/pgstore ./lockserver/store/etcdstore ./harness/soak ./harness/gameday ./functions/e2e ./harness
test: ## run every test (starts its own PostgreSQL clusters and embedded etcd), then the SDK modules' tests, each alone; installs PostgreSQL 15, Prometheus and Alertmanager first if missing (as root), else prints the command (and stops without PostgreSQL)
	@bash .ci/deps postgres -optional promtool prometheus docsite netns
	$(GO) test -race -count=1 -p 3 -timeout 12m $(SLOW_PKGS) $(PKGS)
	@set -e; for m in $(SDK_MODS); do echo "== $$m (module)"; (cd $$m && GOWORK=off $(GO) test -race -count=1 ./...); done

# What make test splits between the two lock backends, run whole on both
# (-matrix.full): the end-to-end matrices (functions/e2e, harness; make
# test runs each case on one backend, alternating) and the store suites
# through lock-server (TestContractOverHTTP, TestAbandonedGrantsThroughLockServer
# of pgstore and etcdstore; make test runs their even cases on PostgreSQL
# and the odd on etcd, storetest.Backend.Half). The direct contract,
# TestContract, runs whole on both backends in make test.
test-full: ## the end-to-end tests, the fencing experiment on real processes and the store suites through lock-server, with every case on both lock backends (make test runs each on one); installs PostgreSQL 15 first if missing (as root), else prints the command (about 5 min, then 1.5 min for the store suites)
	@bash .ci/deps postgres
	$(GO) test -race -count=1 -timeout 20m ./functions/e2e/ ./harness/ -args -matrix.full
	$(GO) test -race -count=1 -timeout 10m -run '^(TestContractOverHTTP|TestAbandonedGrantsThroughLockServer)$$' ./lockserver/store/pgstore/ ./lockserver/store/etcdstore/ -args -matrix.full

FUZZTIME     ?= 30s
FUZZPARALLEL ?= 1
# Go minimizes every new interesting input for up to a minute by default;
# for the database targets (a few hundred runs a second) that can eat most
# of FUZZTIME, so the budget for each minimization is kept small.
FUZZMINIMIZETIME ?= 5s

# go test -list names each package's targets before the package's "ok"
# line; awk pairs them. Each target runs alone (the fuzzer takes one target
# per run); its seed corpus already runs in `make test`.
fuzz: ## run every fuzz target (FuzzXxx), the SDK modules' too, for FUZZTIME (default 30s) each, one after another, FUZZPARALLEL workers (default 1)
	@set -eo pipefail; export GOWORK=off; \
	for m in . $(SDK_MODS); do pkgs=./...; [ $$m != . ] || pkgs='$(PKGS)'; \
	  targets=$$(cd $$m && $(GO) test -list '^Fuzz' $$pkgs | awk '/^Fuzz/ {t[n++]=$$1; next} /^ok/ {for (i = 0; i < n; i++) print $$2 "," t[i]; n = 0}'); \
	  echo "fuzz targets in $$m: $$(echo $$targets | wc -w), $(FUZZTIME) each"; \
	  for pt in $$targets; do pkg=$${pt%,*}; t=$${pt#*,}; \
	    echo "== $$t ($$pkg)"; \
	    (cd $$m && $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) -parallel $(FUZZPARALLEL) $$pkg); \
	  done; \
	done

# The Terraform scanners, built with go install (.ci/run installs both;
# they are looked for on PATH and in go env GOPATH's bin). Without one, lint
# says so and skips it, except under CI, where it fails.
TFLINT_MOD := github.com/terraform-linters/tflint@v0.64.0
TFSEC_MOD  := github.com/aquasecurity/tfsec/cmd/tfsec@v1.26.0
define scanner
	@PATH="$$PATH:$$($(GO) env GOPATH)/bin"; \
	if ! command -v $(1) >/dev/null; then \
	  echo "lint: $(1) not found (go install $(2))"; [ -z "$$CI" ] || exit 1; \
	else $(3); fi
endef

lint: ## gofmt, go vet, staticcheck (the SDK modules too, each alone), terraform fmt, tflint and tfsec; fails on any finding
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)
	@set -e; sc=$$($(GO) tool -n staticcheck); for m in $(SDK_MODS); do echo "== $$m (module): build, vet, staticcheck"; \
	  (cd $$m && export GOWORK=off && $(GO) build ./... && $(GO) vet ./... && $$sc ./...); done
	@if command -v terraform >/dev/null; then terraform fmt -check -recursive terraform 2>/dev/null || { echo "terraform fmt would change the files above (run: terraform fmt -recursive terraform)"; exit 1; }; \
	  else echo "lint: terraform not on PATH, skipping terraform fmt -check"; fi
	$(call scanner,tflint,$(TFLINT_MOD),tflint --chdir=terraform --recursive --config=$$PWD/terraform/.tflint.hcl --format=compact)
	$(call scanner,tfsec,$(TFSEC_MOD),tfsec --no-color --concise-output --no-module-downloads --exclude-path cmd terraform)

fmt: ## format every Go file
	gofmt -w $$(git ls-files '*.go')

build: ## build every command into ./bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./lockserver/cmd/... ./etcd/cmd/... ./functions/cmd/... ./local/cmd/... ./harness/cmd/...

# The documentation site (internal/docsite, docs/tooling.md): Debian's
# mkdocs and mkdocs-material. hooks.py fails the build on a broken link or
# anchor, and on a page of docs/ missing from the nav.
DOCS_SITE ?= $(BIN)/site
DOCS_PORT ?= 8000
define need_mkdocs
	@command -v mkdocs >/dev/null || { echo "docs: mkdocs not found (apt-get install mkdocs mkdocs-material)"; exit 1; }
endef

docs: ## build the documentation site (README.md, docs/, harness/README.md) into bin/site (DOCS_SITE); fails on a broken link or anchor
	$(need_mkdocs)
	mkdocs build --strict --config-file internal/docsite/mkdocs.yml --site-dir $(abspath $(DOCS_SITE))

docs-serve: ## serve the documentation site on http://127.0.0.1:8000 (DOCS_PORT), rebuilt on every change
	$(need_mkdocs)
	mkdocs serve --strict --config-file internal/docsite/mkdocs.yml --dev-addr 127.0.0.1:$(DOCS_PORT)

BENCH_COUNT ?= 6

# One whole pass per round, so the rows compared with each other run
# seconds apart, and drift on the machine hits them alike.
bench: ## SDK + lock-server vs the raw backend primitives: BENCH_COUNT rounds (default 6) at GOMAXPROCS 1 and 2, compared by benchstat, and the chart of pairs/s against clients for every path, bin/bench-pairs.svg (about 12 min)
	@mkdir -p $(BIN)
	$(GO) test -c -o $(BIN)/bench.test ./lockserver/bench/
	@rm -f $(BIN)/bench.txt
	@for i in $$(seq $(BENCH_COUNT)); do echo "round $$i of $(BENCH_COUNT)" >&2; \
	  (cd lockserver/bench && ../../$(BIN)/bench.test -test.run '^$$' -test.bench . -test.benchtime 1s -test.cpu 1,2) >> $(BIN)/bench.txt || exit 1; done
	$(GO) tool benchstat -filter '.name:AcquireRelease' -col '/path@(raw raw-lease-per-lock sdk sdk-nobatch store-batched redsync)' $(BIN)/bench.txt
	$(GO) tool benchstat -filter '.name:Contended' -col '/path@(etcd-mutex wait wait-nohandoff barging redsync)' $(BIN)/bench.txt
	$(GO) run ./lockserver/bench/cmd/benchchart -o $(BIN)/bench-pairs.svg $(BIN)/bench.txt

# The contended rows alone (performance target 3, docs/benchmarks.md): handoffs on one key, wait
# queue (handoff on and off) vs barging vs etcd's concurrency.Mutex; BENCH_COUNT rounds.
bench-contended: ## handoffs on one key at 8 and 64 clients: lock-server's wait queue vs the SDK's barging vs etcd's concurrency.Mutex vs go-redsync (needs redis-server, else skipped), BENCH_COUNT rounds, benchstat (about 2 min a round)
	@mkdir -p $(BIN)
	$(GO) test -c -o $(BIN)/bench.test ./lockserver/bench/
	@rm -f $(BIN)/bench-contended.txt
	@for i in $$(seq $(BENCH_COUNT)); do echo "round $$i of $(BENCH_COUNT)" >&2; \
	  (cd lockserver/bench && ../../$(BIN)/bench.test -test.run '^$$' -test.bench Contended -test.benchtime 2s -test.cpu 2) >> $(BIN)/bench-contended.txt || exit 1; done
	$(GO) tool benchstat -col '/path@(etcd-mutex wait wait-nohandoff barging redsync)' $(BIN)/bench-contended.txt

BENCH_E2E_FLAGS ?=

# Performance target 5 (docs/benchmarks.md). A fresh stack per run; its measurements also ride on
# the short crash soak in `make test` (harness/soak), so they cannot rot.
bench-e2e: ## end to end: payouts/s, latency p50/p95/p99, deliveries per executor, CPU per payout per process, HTTP requests per payout by route, what a million payouts cost on Google Cloud, 3 runs per backend, spread (2,000 payouts over 200 accounts, 16 creators) and hot (one account); fails on any broken integrity check; writes harness/out/bench-e2e.json and .md (BENCH_E2E_FLAGS: e.g. -before main -profile 8 -statements; docs/benchmarks.md)
	$(GO) run ./harness/cmd/benche2e -out harness/out $(BENCH_E2E_FLAGS)

BENCH_E2E_CREATORS ?= 1 4 16 64

bench-e2e-creators: ## end to end, spread only (600 payouts over 60 accounts): one benche2e run per number of creators (BENCH_E2E_CREATORS), then the chart of payouts/s against creators, harness/out/bench-e2e-creators.svg (BENCH_E2E_FLAGS as for bench-e2e, e.g. -before main -runs 3)
	for c in $(BENCH_E2E_CREATORS); do \
		$(GO) run ./harness/cmd/benche2e -modes spread -payouts 600 -accounts 60 -creators $$c -out harness/out/creators-$$c $(BENCH_E2E_FLAGS) || exit 1; \
	done
	$(GO) run ./harness/cmd/benche2echart -target 0 -o harness/out/bench-e2e-creators.svg $(foreach c,$(BENCH_E2E_CREATORS),harness/out/creators-$(c)/bench-e2e.json)

explore: ## every ordering of two executors on one payout (one expiry or revoke), every ordering of one executor and the reconciler (two faults of any kind), every ordering of one executor and the reconciler with two faults among forged terms, resends, refusals and give-ups, every ordering of two executors with two faults among expiry, the rail refusing and a resend, 3,000 sampled schedules of each sample (two of them over two lock-server replicas, one restarted once); checked from the rail's journal and the books
	$(GO) test -count=1 -timeout 120m -run 'TestExhaustive|TestSampled|TestRegressionSchedules|TestAdversaryCoverage' -v ./harness/explore/ -args -explore.full

UP_FLAGS ?=

# Built, then run: `go run` exits 1 whenever it sees Ctrl-C, even when the
# program stopped cleanly, and make would report that as an error. The
# program exits 0 after a clean stop; make then ends quietly (status 130).
up: ## the whole stack on loopback until Ctrl-C (bin/local up $(UP_FLAGS), built from ./local; e.g. UP_FLAGS='-backend etcd -traces spans.jsonl'); installs PostgreSQL 15 first if missing (as root), else prints the command
	@bash .ci/deps postgres
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/local ./local
	$(BIN)/local up $(UP_FLAGS)

demo: ## the fencing experiment on real processes, 2 backends x 4 fencing cells; writes harness/out/summary.json; installs PostgreSQL 15 first if missing (as root), else prints the command
	@bash .ci/deps postgres
	$(GO) run ./harness/cmd/experiment -out harness/out

# The credential check of labenv (tfdriver.Preflight) in the shell, so that
# a missing credential stops the target at once with labenv's one line,
# before go builds anything (terraform/cmd/labenv's TestMakeTargetsStopBeforeGo
# keeps the two the same).
define cloud_preflight
	@missing=""; \
	[ -n "$$GOOGLE_CLOUD_PROJECT" ] || missing="$$missing, GOOGLE_CLOUD_PROJECT (the lab's dedicated project id)"; \
	[ -n "$$BILLING_ACCOUNT$$TF_VAR_billing_account" ] || missing="$$missing, BILLING_ACCOUNT (the billing account id the budget is created on)"; \
	if [ -n "$$GOOGLE_APPLICATION_CREDENTIALS" ]; then adc="$$GOOGLE_APPLICATION_CREDENTIALS"; \
	elif [ -n "$$CLOUDSDK_CONFIG" ]; then adc="$$CLOUDSDK_CONFIG/application_default_credentials.json"; \
	elif [ -n "$$HOME" ]; then adc="$$HOME/.config/gcloud/application_default_credentials.json"; else adc=""; fi; \
	[ -n "$$adc" ] && [ -e "$$adc" ] || missing="$$missing, Application Default Credentials (run: gcloud auth application-default login)"; \
	if [ -n "$$missing" ]; then echo "labenv $(1): tfdriver: missing $${missing#, }" >&2; exit 2; fi
endef

SOAK_BACKEND ?= postgres,etcd
SOAK_PAYOUTS ?= 10000
SOAK_FAULTS  ?= kill
SOAK_FLAGS   ?=

soak: ## crash soak: SOAK_PAYOUTS (default 10000) payouts per backend (SOAK_BACKEND=postgres|etcd, default both in turn) while every kind of process is SIGKILLed and restarted (SOAK_FAULTS=kill,net adds network faults on every link between processes; net alone: only those); writes harness/out/soak.json and soak-BACKEND.svg (SOAK_FLAGS: more flags, e.g. -seed N)
	$(GO) run ./harness/cmd/soak -backend $(SOAK_BACKEND) -payouts $(SOAK_PAYOUTS) -faults $(SOAK_FAULTS) -out harness/out $(SOAK_FLAGS)

gameday: ## local game day: the stack, a real Prometheus and Alertmanager, every fault injected in turn; detection latency and time to runbook step per alert in harness/out/gameday.json and gameday.md (docs/gameday.md); installs its packages first if missing (as root), else prints the command
	@bash .ci/deps postgres prometheus
	$(GO) run ./harness/cmd/gameday -out harness/out

MONTH_BACKEND ?= postgres,etcd
MONTH_FLAGS   ?=

month: ## simulated month (SC-10): the stack under steady load and a real Prometheus, a month of Google Cloud's faults at their real length (MONTH_BACKEND=postgres|etcd, default both in turn), the SLIs scaled to 30 days against the error-budget policy; writes harness/out/month-BACKEND.json, .md and .svg (docs/month.md; MONTH_FLAGS: e.g. -seed N; 10 to 11 min of run per backend, 18 with the build and start on a loaded machine)
	@bash .ci/deps postgres prometheus
	$(GO) run ./harness/cmd/month -backend $(MONTH_BACKEND) -out harness/out $(MONTH_FLAGS)

FAILOVER_SEEDS ?= 1,2,3
FAILOVER_FLAGS ?=

failover: ## lockdb failover (SC-08): kill the primary under SDK clients, promote the standby, synchronous then asynchronous replication, FAILOVER_SEEDS (default 1,2,3); writes harness/out/failover.json (FAILOVER_FLAGS: e.g. -standby-stall 5s -clients 16)
	$(GO) run ./harness/cmd/failover -mode sync,async -seeds $(FAILOVER_SEEDS) -out harness/out $(FAILOVER_FLAGS)

partitions: ## network partitions between real processes in Linux network namespaces (needs root and iproute2): etcd minority with the leader on either side, lock-server cut from lockdb, an asymmetric cut, each under the linearizability workload, and the SDK's deadline under latency spikes (about 4 min; `make test` runs the leader-in-minority cut and a short latency run; docs/reliability.md#partitions)
	$(GO) test -count=1 -timeout 20m -v ./harness/partition/ -args -partitions.full

plan: ## Google Cloud: terraform init and a saved plan with its resource counts (needs GOOGLE_CLOUD_PROJECT, BILLING_ACCOUNT, gcloud ADC; docs/cloud.md)
	$(call cloud_preflight,plan)
	$(GO) run ./terraform/cmd/labenv plan

deploy: ## Google Cloud: enable the APIs labenv needs, signing keys (Secret Manager), apply (budget first; one retry on a transient error), schema grants, lock-server's Kubernetes Secret, then cloudbuild.yaml with this commit; a failed apply is kept (LABENV_FLAGS=-destroy-on-failure destroys it)
	$(call cloud_preflight,deploy)
	$(GO) run ./terraform/cmd/labenv $(LABENV_FLAGS) deploy

destroy: ## Google Cloud: delete the GKE objects, terraform destroy, then the zero-billable check through the Google Cloud APIs
	$(call cloud_preflight,destroy)
	$(GO) run ./terraform/cmd/labenv destroy

clean: ## remove build output and the experiment's outputs (harness/out)
	rm -rf $(BIN) harness/out
