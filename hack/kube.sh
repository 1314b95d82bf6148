#!/usr/bin/env bash
# Builds the Kubernetes components the tests run, from the k8s.io/kubernetes module pinned in
# hack/tools/kube, into .cache/bin (ignored by git): kube-apiserver (integration tests),
# kubelet, kube-proxy, kube-scheduler, kube-controller-manager (the cluster harness), kubectl
# and kubeadm (the install docs' test). Idempotent: a binary built from the same pin is reused.
# Those missing are built in one `go build` with one set of flags, so the packages they share
# compile once and both cores stay busy to the last link. First build on a cold Go cache:
# about 15 minutes on 2 cores for all seven (kube-apiserver alone about 5).
#
#   hack/kube.sh                   # all seven
#   hack/kube.sh kube-apiserver    # only the ones named
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools/kube"
all=(kube-apiserver kubelet kube-proxy kube-scheduler kube-controller-manager kubectl kubeadm)
want=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -d' ' -f1)
version=$(cd "$tools" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
bin="$root/.cache/bin"
mkdir -p "$bin"
[ $# -gt 0 ] || set -- "${all[@]}"
missing=()
for c in "$@"; do
  case " ${all[*]} " in *" $c "*) ;; *) echo "hack/kube.sh: unknown component $c (one of: ${all[*]})" >&2; exit 2 ;; esac
  [ -x "$bin/$c" ] && [ "$(cat "$bin/$c.stamp" 2>/dev/null)" = "$want" ] || missing+=("$c")
done
[ ${#missing[@]} -gt 0 ] || exit 0
echo "hack/kube.sh: building ${missing[*]} $version into $bin" >&2
t0=$(date +%s)
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tools" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${missing[@]/#/k8s.io/kubernetes/cmd/}")
for c in "${missing[@]}"; do
  mv "$tmp/$c" "$bin/$c"
  echo "$want" > "$bin/$c.stamp"
done
echo "hack/kube.sh: built ${missing[*]} in $(( $(date +%s) - t0 ))s" >&2
