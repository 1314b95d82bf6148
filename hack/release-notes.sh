#!/usr/bin/env bash
# Writes a release's notes to stdout: what changed (CHANGELOG.md's section of the version, or
# its Unreleased section when the version has none yet), the images by digest, and how to
# install and upgrade. `make release` runs it into _output/release/NOTES.md.
#
#   hack/release-notes.sh VERSION COMMIT IMAGES_TXT
set -euo pipefail
version=$1 commit=$2 images=$3
root=$(cd "$(dirname "$0")/.." && pwd)
changelog="$root/CHANGELOG.md"
section() { # the lines under "## [$1]" up to the next "## [" heading
  awk -v want="## [$1]" 'index($0, "## [") == 1 { on = (index($0, want) == 1); next } on' "$changelog"
}
changes=$(section "${version#v}")
[ -n "$(tr -d '[:space:]' <<<"$changes")" ] || changes=$(section "$version")
[ -n "$(tr -d '[:space:]' <<<"$changes")" ] || changes=$(section Unreleased)
[ -n "$(tr -d '[:space:]' <<<"$changes")" ] || { echo "hack/release-notes.sh: CHANGELOG.md has no section for $version nor an Unreleased one" >&2; exit 1; }
[ -s "$images" ] || { echo "hack/release-notes.sh: no images in $images" >&2; exit 1; }
cat <<NOTES
# metalvip $version

Built from commit $commit.

## Images (pull by digest)

$(sed -E 's/^[^=]*=(.*)$/- `\1`/' "$images")

## Install or upgrade

- Manifests: \`kubectl apply --server-side -f install.yaml\` (this release's, its images pinned by digest).
- Helm: \`helm upgrade --install metalvip metalvip-*.tgz -n kube-system -f values.yaml\` (the chart package and the values pinning the images).
- Which versions work together, how to upgrade and roll back, what clients see: docs/upgrading.md.

## Changes
$changes
NOTES
