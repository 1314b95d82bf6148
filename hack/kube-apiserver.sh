#!/usr/bin/env bash
# Builds the real kube-apiserver the integration tests run, from the k8s.io/kubernetes module
# pinned in hack/tools/kube-apiserver, into .cache/bin (ignored by git). Idempotent: an
# existing binary built from the same pin is reused. First build: about 5 minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.cache/bin/kube-apiserver"
stamp="$out.stamp"
tools="$root/hack/tools/kube-apiserver"
want=$(sha256sum "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -d' ' -f1)

if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$tools/go.mod")
echo "kube-apiserver: building $version into $out (first build takes about 5 minutes)"
mkdir -p "$(dirname "$out")"
cd "$tools"
ldflags="-X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
go build -trimpath -ldflags "$ldflags" -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$out.tmp" "$out"
echo "$want" > "$stamp"
