# metalvip. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
TOOL      := $(GO) tool -modfile=hack/tools/go.mod
VERSION   ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || echo v0.0.0-$$(git rev-parse --short HEAD 2>/dev/null || echo unknown))
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The one definition of a build's identity: `make build` and `make images` both link with it.
# internal/version is what --version prints; component-base's is what the CCM's framework logs
# and exports as kubernetes_build_info.
LDFLAGS   := -X github.com/metalvip/metalvip/internal/version.version=$(VERSION) \
             -X github.com/metalvip/metalvip/internal/version.commit=$(COMMIT) \
             -X k8s.io/component-base/version.gitVersion=$(VERSION) \
             -X k8s.io/component-base/version.gitCommit=$(COMMIT)
BINARIES  := metalvip-cloud-controller-manager metalvip-agent metalvipctl
# Whole packages run in parallel; the e2e and lab packages bound their own times.
TEST_FLAGS ?= -count=1 -timeout 40m

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the binaries into bin/.
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

.PHONY: demo
demo: deps ## The lab demonstration (as root): the whole system, a table of who answers what, a failover. KEEP=1 keeps it up.
	$(GO) run ./test/demo

.PHONY: bench
bench: deps ## Measure against the targets and write docs/benchmarks.md (as root; about 10 minutes).
	$(GO) run ./test/bench

IMAGE_TAG ?= v0.1.0
.PHONY: images
images: ## Build the CCM and agent images as tarballs in _output/images (no container daemon needed).
	@mkdir -p _output/images/bin
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' -o _output/images/bin/ ./cmd/metalvip-cloud-controller-manager ./cmd/metalvip-agent
	cd hack/tools && $(GO) run ./images -bin ../../_output/images/bin -out ../../_output/images -version $(IMAGE_TAG) -revision $$(git rev-parse HEAD 2>/dev/null || echo unknown)

.PHONY: deps
deps: ## Install what the tests need: Debian packages and the kube-apiserver build (idempotent).
	hack/install-deps.sh
	hack/kube-apiserver.sh

.PHONY: test
test: deps ## Run unit, integration and lab tests (lab tests need root).
	$(GO) test $(TEST_FLAGS) ./...

.PHONY: test-unit
test-unit: ## Run only the tests that need neither root nor an API server.
	$(GO) test -count=1 -short ./...

.PHONY: lint
lint: ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOL) staticcheck ./...

.PHONY: generate
generate: ## Regenerate deepcopy code, CRD manifests and the agent's protobuf code (lints the proto first).
	$(TOOL) controller-gen object paths=./api/...
	$(TOOL) controller-gen crd:crdVersions=v1 paths=./api/... output:crd:artifacts:config=manifests/crds
	cd proto && $(GO) tool -modfile=../hack/tools/go.mod buf lint
	cd proto && $(GO) tool -modfile=../hack/tools/go.mod buf generate
	$(GO) run ./hack/render manifests

.PHONY: verify-generate
verify-generate: generate ## Fail if generated files are stale.
	@git diff --exit-code -- . ':!go.sum' || { echo "generated files are stale: run make generate and commit"; exit 1; }

.PHONY: clean
clean: ## Remove build output (keeps the kube-apiserver cache in .cache/).
	rm -rf bin _output
