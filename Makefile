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
# The release tools' own packages (module hack/tools), tested and linted with the rest.
TOOLS_PACKAGES := ./images/ ./render/ ./protocompat/
# Whole packages run in parallel; the e2e and lab packages bound their own times.
TEST_FLAGS ?= -count=1 -timeout 80m

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: version
version: ## Print the version and commit that make links into the binaries.
	@echo $(VERSION) $(COMMIT)

.PHONY: build
build: ## Build the binaries into bin/ (and bin/kubectl-metalvip, kubectl's plugin: a link to metalvipctl).
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))
	ln -sf metalvipctl bin/kubectl-metalvip

.PHONY: demo
demo: deps ## The lab demonstration (as root): the whole system, a table of who answers what, a failover. KEEP=1 keeps it up.
	$(GO) run ./test/demo

.PHONY: demo-cluster
demo-cluster: deps cluster-deps ## The same on real kubelets (as root): a cluster in the lab, metalvip installed from install.yaml as pods, a workload, a failover. KEEP=1 keeps it up.
	$(GO) run ./test/democluster

.PHONY: cluster-deps
cluster-deps: ## Build what the real-kubelet cluster needs: kubelet, kube-proxy, scheduler, controller-manager (.cache/bin), kubectl, helm, the images, and the previous version's (hack/previous.sh).
	hack/kube.sh kube-apiserver kubelet kube-proxy kube-scheduler kube-controller-manager kubectl
	hack/tool.sh helm >/dev/null
	$(MAKE) images cluster-images
	hack/previous.sh

.PHONY: bench
bench: deps cluster-deps ## Measure against the targets and write docs/benchmarks.md (as root; about 20 minutes, the first time longer: it builds the real-kubelet cluster).
	$(GO) run ./test/bench

.PHONY: bench-scale
bench-scale: deps ## 1,000 simulated nodes and 20,000 Services against the real CCM and API server; writes docs/benchmarks-scale.md (about 30 minutes, most of the machine).
	$(GO) run ./test/scale $(SCALE_FLAGS)

# Images: a multi-architecture OCI image index per binary, packed without a container daemon
# (hack/tools/images). The tag is the chart's appVersion, the one manifests/install.yaml names;
# each image also gets the build's own tag (appVersion and a hash of the images, new with any
# changed binary), which _output/images/install.yaml and values.yaml name: applying them rolls out
# a rebuilt tree, where the appVersion tag alone would change no pod spec.
IMAGE_REGISTRY ?= ghcr.io/metalvip
IMAGE_TAG      ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/metalvip/Chart.yaml)
PLATFORMS      ?= linux/amd64 linux/arm64
IMAGE_BINARIES := metalvip-cloud-controller-manager metalvip-agent
HELM            = $$(hack/tool.sh helm)

.PHONY: images
images: ## Build the images: _output/images/oci (OCI layout, one index per binary), _output/images/<os>-<arch>/*.tar, and install.yaml and chart values naming this build's own tag.
	@for p in $(PLATFORMS); do \
	  echo "go build $$p"; \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' \
	    -o _output/images/bin/$${p%/*}_$${p#*/}/ $(addprefix ./cmd/,$(IMAGE_BINARIES)); \
	done
	cd hack/tools && $(GO) run ./images build -bin ../../_output/images/bin -out ../../_output/images \
	  -platforms '$(PLATFORMS)' -repository $(IMAGE_REGISTRY) -tag $(IMAGE_TAG) -version $(VERSION) -revision $(COMMIT) \
	  -build-tag-out ../../_output/images/build-tag
	cd hack/tools && $(GO) run ./render -dir ../../manifests -tag $$(cat ../../_output/images/build-tag) \
	  -o ../../_output/images/install.yaml -values ../../_output/images/values.yaml
	@echo "this build: _output/images/install.yaml and values.yaml name its tag $$(cat _output/images/build-tag)"

# The cluster harness's own images (test/kubecluster): the pods' sandbox and the workload, for
# the host's platform only, imported into the test nodes' containerd (no registry there).
CLUSTER_IMAGES := _output/images/cluster
.PHONY: cluster-images
cluster-images: ## Build the test cluster's pause and HTTP server images into _output/images/cluster/.
	@mkdir -p $(CLUSTER_IMAGES)/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CLUSTER_IMAGES)/bin/ ./test/kubecluster/images/pause ./test/kubecluster/images/httpd
	cd hack/tools && $(GO) run ./images single -bin ../../$(CLUSTER_IMAGES)/bin/pause -ref registry.k8s.io/pause:3.10 -out ../../$(CLUSTER_IMAGES)/pause.tar -platform $$($(GO) env GOOS)/$$($(GO) env GOARCH)
	cd hack/tools && $(GO) run ./images single -bin ../../$(CLUSTER_IMAGES)/bin/httpd -ref example.test/httpd:v1 -out ../../$(CLUSTER_IMAGES)/httpd.tar -platform $$($(GO) env GOOS)/$$($(GO) env GOARCH)

.PHONY: release
release: images ## Push the images to REGISTRY and write _output/release: install.yaml and chart values pinned by digest, the chart package, the release notes (NOTES.md).
	@if [ -z "$(REGISTRY)" ]; then echo "make release REGISTRY=registry.example/metalvip [IMAGE_TAG=...] [VERSION=...]" >&2; exit 2; fi
	@mkdir -p _output/release
	cd hack/tools && $(GO) run ./images push -layout ../../_output/images/oci -registry $(REGISTRY) > ../../_output/release/images.txt
	cd hack/tools && $(GO) run ./render -dir ../../manifests -images ../../_output/release/images.txt \
	  -o ../../_output/release/install.yaml -values ../../_output/release/values.yaml
	$(HELM) package charts/metalvip -d _output/release
	hack/release-notes.sh $(VERSION) $(COMMIT) _output/release/images.txt > _output/release/NOTES.md
	@cat _output/release/images.txt

.PHONY: chart
chart: ## Lint the Helm chart and package it into _output/chart (helm built once into .cache/bin).
	$(HELM) lint --strict charts/metalvip
	$(HELM) package charts/metalvip -d _output/chart

.PHONY: deps
deps: ## Install what the tests need: Debian packages and the kube-apiserver build (idempotent).
	hack/install-deps.sh
	hack/kube.sh kube-apiserver

.PHONY: test-deps
test-deps: ## Build what the tests use before any runs: every Kubernetes component in one go build (hack/kube.sh), Kubernetes' e2e specs, CoreDNS and the agnhost image (hack/conformance.sh), helm and promtool (.cache/bin), the images (the host's platform only), and the previous version's for the upgrade e2e (hack/previous.sh).
	hack/kube.sh
	hack/conformance.sh
	hack/tool.sh helm >/dev/null
	hack/tool.sh promtool >/dev/null
	$(MAKE) images cluster-images PLATFORMS=linux/$$($(GO) env GOARCH)
	hack/previous.sh

.PHONY: test-cluster
test-cluster: test-deps deps ## Run only the real-kubelet e2e (test/e2ecluster: install.yaml and the chart on a lab cluster; root; part of make test).
	$(GO) test -count=1 -timeout 40m ./test/e2ecluster/

.PHONY: test-conformance
test-conformance: test-deps deps ## Run only Kubernetes' own LoadBalancer e2e specs against metalvip on real kubelets, L2 and BGP (test/conformance; root; part of make test; docs/conformance.md).
	$(GO) test -count=1 -timeout 80m -v ./test/conformance/

.PHONY: test
# test-deps first: building helm or the images beside the lab's timing-sensitive tests would
# compete with them for the CPU.
test: test-deps deps ## Run unit, integration and lab tests (lab tests need root), and the release tools' tests.
	$(GO) test $(TEST_FLAGS) ./...
	cd hack/tools && $(GO) test $(TEST_FLAGS) $(TOOLS_PACKAGES)

.PHONY: chaos
chaos: deps ## The fault soak: a seeded schedule of faults on the lab, invariants checked on the wire (root). DURATION=60m SEED=1,2,3; make test runs a short form.
	METALVIP_CHAOS_DURATION=$(DURATION) METALVIP_CHAOS_SEEDS=$(SEED) $(GO) test -count=1 -timeout 0 -v -run TestChaos ./test/chaos/

.PHONY: test-unit
test-unit: ## Run only the tests that need neither root nor an API server.
	$(GO) test -count=1 -short ./...

.PHONY: lint
lint: ## gofmt, go vet, staticcheck, and metalvipctl built for macOS.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOL) staticcheck ./...
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./cmd/metalvipctl  # metalvipctl runs on an operator's Mac
	cd hack/tools && $(GO) vet $(TOOLS_PACKAGES) && $(GO) tool staticcheck $(TOOLS_PACKAGES)

.PHONY: generate
generate: ## Regenerate deepcopy code, CRD manifests and the agent's protobuf code (lints the proto first).
	$(TOOL) controller-gen object paths=./api/...
	$(TOOL) controller-gen crd:crdVersions=v1 paths=./api/... output:crd:artifacts:config=manifests/crds
	cd proto && $(GO) tool -modfile=../hack/tools/go.mod buf lint
	cd proto && $(GO) tool -modfile=../hack/tools/go.mod buf generate
	cp manifests/crds/*.yaml charts/metalvip/crds/
	cd hack/tools && $(GO) run ./render -dir ../../manifests -o ../../manifests/install.yaml

.PHONY: proto-baseline
proto-baseline: ## At a release: take the agent API as the baseline later versions must stay compatible with (hack/tools/protocompat).
	cd proto && $(GO) tool -modfile=../hack/tools/go.mod buf build -o breaking-baseline.binpb

.PHONY: verify-generate
verify-generate: generate ## Fail if generated files are stale.
	@git diff --exit-code -- . ':!go.sum' || { echo "generated files are stale: run make generate and commit"; exit 1; }

.PHONY: clean
clean: ## Remove build output (keeps the kube-apiserver cache in .cache/).
	rm -rf bin _output
