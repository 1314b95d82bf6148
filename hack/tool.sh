#!/usr/bin/env bash
# Prints the path of a build tool pinned in hack/tools/go.mod, built once into .cache/bin (ignored
# by git) and reused until hack/tools/go.mod or go.sum change. `go tool` would relink large tools
# (helm: about 120 MB, 10 minutes on a cold cache here) after every Go cache trim; tests and
# make targets call this instead.
#
#   hack/tool.sh helm        # -> /path/to/repo/.cache/bin/helm
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools"
case "${1:-}" in
  helm) pkg=helm.sh/helm/v4/cmd/helm ;;
  *) echo "usage: hack/tool.sh helm" >&2; exit 2 ;;
esac
out="$root/.cache/bin/$1"
want=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$want" ]; then
  echo "$out"
  exit 0
fi
echo "hack/tool.sh: building $1 into $out (once; about 10 minutes on a cold Go cache)" >&2
mkdir -p "$(dirname "$out")"
version=$(awk -v m="${pkg%%/cmd/*}" '$1 == m {print $2}' "$tools/go.mod")
tmp=$(mktemp "$out.XXXXXX")
(cd "$tools" && go build -trimpath -ldflags "-X helm.sh/helm/v4/internal/version.version=$version" -o "$tmp" "$pkg")
mv "$tmp" "$out"
echo "$want" > "$out.stamp"
echo "$out"
