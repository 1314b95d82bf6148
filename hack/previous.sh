#!/usr/bin/env bash
# Builds the version the upgrade steps of test/e2ecluster roll back to and upgrade from: until a
# first release, the commit pinned in hack/previous.commit (one of this repository's, so a clone
# of main has it). Its tree (git archive), its images for this machine's platform tagged
# :previous, and its install.yaml naming them go to _output/previous (ignored by git); done
# again only when the pinned commit changes.
#
#   hack/previous.sh    # then: _output/previous/{commit,install.yaml,src/charts/metalvip,images/}
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
commit=$(git rev-parse --verify "$(tr -d '[:space:]' < hack/previous.commit)^{commit}")
arch=$(go env GOARCH)
out=_output/previous
if [ "$(cat "$out/commit" 2>/dev/null)" = "$commit" ] && [ -f "$out/images/linux-$arch/metalvip-agent.tar" ]; then
  exit 0
fi
rm -rf "$out"
mkdir -p "$out/src"
git archive "$commit" | tar -x -C "$out/src"
# Its own Makefile builds its images; the version and commit are given, as the folder is no
# repository of its own (and VCS stamping would read this one's).
GOFLAGS=-buildvcs=false make -C "$out/src" images PLATFORMS="linux/$arch" IMAGE_TAG=previous \
  VERSION="v0.0.0-previous-${commit:0:12}" COMMIT="$commit" >"$out/build.log" 2>&1 || {
  tail -30 "$out/build.log" >&2
  echo "hack/previous.sh: building the images of $commit failed (log: $out/build.log)" >&2
  exit 1
}
mkdir -p "$out/images"
cp -r "$out/src/_output/images/linux-$arch" "$out/images/"
# Its install.yaml with its images: the tag :previous instead of the one it names.
sed -E 's#(ghcr\.io/metalvip/metalvip-(cloud-controller-manager|agent)):[^"[:space:]]+#\1:previous#' \
  "$out/src/manifests/install.yaml" > "$out/install.yaml"
grep -q 'metalvip-agent:previous' "$out/install.yaml" || { echo "hack/previous.sh: no agent image in $out/install.yaml" >&2; exit 1; }
echo "$commit" > "$out/commit"
