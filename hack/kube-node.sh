#!/usr/bin/env bash
# Builds the Kubernetes components the cluster harness (test/kubecluster) runs beside the
# kube-apiserver of hack/kube-apiserver.sh: kubelet, kube-proxy, kube-scheduler and
# kube-controller-manager, from the k8s.io/kubernetes module pinned in hack/tools/kube-node,
# into .cache/bin (ignored by git). Idempotent: a binary built from the same pin is reused.
# First build on a warm module cache: about 4 minutes on 2 cores (kubelet the longest).
#
#   hack/kube-node.sh              # all four
#   hack/kube-node.sh kubelet      # only the ones named
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools/kube-node"
want=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -d' ' -f1)
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$tools/go.mod")
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
mkdir -p "$root/.cache/bin"
[ $# -gt 0 ] || set -- kubelet kube-proxy kube-scheduler kube-controller-manager
for c in "$@"; do
  case $c in kubelet|kube-proxy|kube-scheduler|kube-controller-manager) ;;
    *) echo "hack/kube-node.sh: unknown component $c" >&2; exit 2 ;; esac
  out="$root/.cache/bin/$c"
  if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$want" ]; then continue; fi
  echo "hack/kube-node.sh: building $c $version into $out" >&2
  t0=$(date +%s)
  tmp=$(mktemp "$out.XXXXXX")
  (cd "$tools" && go build -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$c") || { rm -f "$tmp"; exit 1; }
  chmod 0755 "$tmp"
  mv "$tmp" "$out"
  echo "$want" > "$out.stamp"
  echo "hack/kube-node.sh: built $c in $(( $(date +%s) - t0 ))s" >&2
done
