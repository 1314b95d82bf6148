#!/usr/bin/env bash
# Builds what the conformance run (test/conformance) needs beside the cluster's components, into
# .cache (ignored by git), each again only when its sources change:
#   .cache/bin/e2elb.test      Kubernetes' sig-network e2e specs (hack/tools/kube/e2elb: go test -c
#                              of the k8s.io/kubernetes release hack/kube.sh builds from)
#   .cache/bin/coredns         the cluster DNS (hack/tools/coredns: CoreDNS's Go module)
#   .cache/images/agnhost.tar  registry.k8s.io/e2e-test-images/agnhost:2.66.1, named as the specs
#                              expect (hack/tools/kube/agnhost: their subcommands and shell tools)
# A cold build takes a few minutes on 2 cores (e2elb.test links test/e2e/network and the
# framework); warm ones seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.cache/bin"
images="$root/.cache/images"
mkdir -p "$bin" "$images"

# stamp is a hash of a module's go.mod and go.sum and the named source folders.
stamp() {
  local mod=$1; shift
  (cd "$mod" && cat go.mod go.sum $(find "$@" -type f -name '*.go' | sort)) | sha256sum | cut -d' ' -f1
}
fresh() { [ -e "$1" ] && [ "$(cat "$1.stamp" 2>/dev/null)" = "$2" ]; }

kube="$root/hack/tools/kube"
want=$(stamp "$kube" e2elb)
if ! fresh "$bin/e2elb.test" "$want"; then
  echo "hack/conformance.sh: building e2elb.test" >&2
  t0=$(date +%s)
  (cd "$kube" && go test -c -vet=off -o "$bin/e2elb.test.new" ./e2elb)
  mv "$bin/e2elb.test.new" "$bin/e2elb.test" && echo "$want" > "$bin/e2elb.test.stamp"
  echo "hack/conformance.sh: built e2elb.test in $(( $(date +%s) - t0 ))s" >&2
fi

want=$(stamp "$root/hack/tools/coredns" .)
if ! fresh "$bin/coredns" "$want"; then
  echo "hack/conformance.sh: building coredns" >&2
  (cd "$root/hack/tools/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$bin/coredns.new" .)
  mv "$bin/coredns.new" "$bin/coredns" && echo "$want" > "$bin/coredns.stamp"
fi

want=$(stamp "$kube" agnhost)-$(stamp "$root/hack/tools" images)
if ! fresh "$images/agnhost.tar" "$want"; then
  echo "hack/conformance.sh: building the agnhost image" >&2
  mkdir -p "$images/bin"
  (cd "$kube" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$images/bin/agnhost" ./agnhost)
  (cd "$root/hack/tools" && go run ./images single -bin "$images/bin/agnhost" \
    -ref registry.k8s.io/e2e-test-images/agnhost:2.66.1 -out "$images/agnhost.tar.new" -user 0:0 \
    -platform "$(go env GOOS)/$(go env GOARCH)" -cmd pause \
    -links /agnhost,/bin/sh,/usr/local/bin/nc,/usr/local/bin/curl,/usr/local/bin/wget,/usr/local/bin/seq)
  mv "$images/agnhost.tar.new" "$images/agnhost.tar" && echo "$want" > "$images/agnhost.tar.stamp"
fi
