#!/usr/bin/env bash
# Prints the path of a large build tool, built once into .cache/bin (ignored by git) from its
# pinned module and reused until that module's go.mod or go.sum change. `go tool` would relink
# them after every Go cache trim (helm: about 120 MB, 4 to 10 minutes here on a cold cache);
# tests and make targets call this instead.
#
#   hack/tool.sh helm      # helm v4, pinned in hack/tools/go.mod (a `go tool` there)
#   hack/tool.sh promtool  # Prometheus's promtool, pinned in hack/tools/promtool/go.mod, built
#                          # with remove_all_sd (no service discovery; it checks rule files)
#   hack/tool.sh kubectl   # kubectl of the tests' Kubernetes release (hack/kube.sh builds it)
#   hack/tool.sh kubeadm   # kubeadm of that release (validates the install docs' configuration)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  helm)
    module="$root/hack/tools" pkg=helm.sh/helm/v4/cmd/helm
    version=$(awk '$1 == "helm.sh/helm/v4" {print $2}' "$module/go.mod")
    ldflags="-X helm.sh/helm/v4/internal/version.version=$version" ;;
  promtool)
    module="$root/hack/tools/promtool" pkg=github.com/prometheus/prometheus/cmd/promtool
    version=$(awk '$1 == "github.com/prometheus/prometheus" {print $2}' "$module/go.mod")
    ldflags="-X github.com/prometheus/common/version.Version=$version"
    tags=remove_all_sd ;;
  kubectl|kubeadm)
    "$root/hack/kube.sh" "$1"
    echo "$root/.cache/bin/$1"
    exit 0 ;;
  *) echo "usage: hack/tool.sh helm|promtool|kubectl|kubeadm" >&2; exit 2 ;;
esac
out="$root/.cache/bin/$1"
want=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$want" ]; then
  echo "$out"
  exit 0
fi
echo "hack/tool.sh: building $1 $version into $out (once; minutes on a cold Go cache)" >&2
mkdir -p "$(dirname "$out")"
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT
(cd "$module" && go build -trimpath -tags "${tags:-}" -ldflags "$ldflags" -o "$tmp" "$pkg")
chmod 0755 "$tmp"
mv "$tmp" "$out"
echo "$want" > "$out.stamp"
echo "$out"
