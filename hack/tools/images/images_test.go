package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const repoRoot = "../../.."

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestReleasePushesAndPullsByDigest runs `make release` against an in-process registry
// (go-containerregistry's pkg/registry) and pulls every image back by digest alone: two
// architectures per binary, each binary of the right ELF machine, the amd64 ones run, and the
// release's install.yaml and chart values name exactly the digests the registry holds.
func TestReleasePushesAndPullsByDigest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images for two architectures; not run with -short")
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	repo := strings.TrimPrefix(reg.URL, "http://") + "/metalvip-test"
	// The build's identity as make links it (not overridden, so that _output/images stays the
	// build `make images` makes).
	ident, err := exec.Command("make", "-s", "-C", repoRoot, "version").Output()
	if err != nil {
		t.Fatalf("make version: %v", err)
	}
	version, commit, ok := strings.Cut(strings.TrimSpace(string(ident)), " ")
	if !ok || version == "" || len(commit) < 7 {
		t.Fatalf("make version printed %q", ident)
	}

	start := time.Now()
	cmd := exec.Command("make", "release", "REGISTRY="+repo)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	t.Logf("make release (two platforms, push, render, chart package) took %s", time.Since(start).Round(time.Millisecond))

	release := filepath.Join(repoRoot, "_output", "release")
	pins := readFile(t, filepath.Join(release, "images.txt"))
	installYAML := readFile(t, filepath.Join(release, "install.yaml"))
	values := readFile(t, filepath.Join(release, "values.yaml"))
	// The release notes: the version, what changed (CHANGELOG.md), the images by digest.
	notes := readFile(t, filepath.Join(release, "NOTES.md"))
	if !strings.HasPrefix(notes, "# metalvip "+version+"\n") || !strings.Contains(notes, commit) || !strings.Contains(notes, "\n## Changes\n") || !strings.Contains(notes, "\n### Added\n") {
		t.Errorf("the release notes lack the version, the commit or CHANGELOG.md's changes:\n%s", notes)
	}
	for _, im := range Images {
		if ref := pinOf(t, pins, im.Binary); !strings.Contains(notes, "- `"+ref+"`\n") {
			t.Errorf("the release notes do not name the image %s", ref)
		}
	}
	lp, err := layout.FromPath(filepath.Join(repoRoot, "_output", "images", "oci"))
	if err != nil {
		t.Fatal(err)
	}
	local := layoutDigests(t, lp)

	for _, im := range Images {
		t.Run(im.Binary, func(t *testing.T) {
			ref := pinOf(t, pins, im.Binary)
			d, err := name.NewDigest(ref)
			if err != nil {
				t.Fatalf("images.txt: %q: %v", ref, err)
			}
			if !strings.HasPrefix(ref, repo+"/"+im.Binary+"@sha256:") {
				t.Errorf("pushed as %s, want under %s", ref, repo)
			}
			if local[im.Binary] != d.DigestStr() {
				t.Errorf("pushed digest %s, the layout holds %s", d.DigestStr(), local[im.Binary])
			}
			if !strings.Contains(installYAML, "image: "+ref+"\n") {
				t.Errorf("the release's install.yaml does not name %s", ref)
			}
			if !strings.Contains(values, "digest: "+d.DigestStr()) {
				t.Errorf("the release's chart values do not pin %s:\n%s", d.DigestStr(), values)
			}

			// Pull by digest: the index and everything under it.
			idx, err := remote.Index(d)
			if err != nil {
				t.Fatalf("pull %s: %v", d, err)
			}
			if got, _ := idx.Digest(); got.String() != d.DigestStr() {
				t.Fatalf("pulled index has digest %s, asked for %s", got, d.DigestStr())
			}
			if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
				t.Errorf("media type %s, want an OCI image index", mt)
			}
			m, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, desc := range m.Manifests {
				arch := desc.Platform.Architecture
				seen[arch] = true
				img, err := remote.Image(d.Context().Digest(desc.Digest.String()))
				if err != nil {
					t.Fatalf("pull %s image %s: %v", arch, desc.Digest, err)
				}
				checkImage(t, im, img, desc.Platform, version, commit)
				checkTarball(t, im, desc, img)
			}
			if len(seen) != 2 || !seen["amd64"] || !seen["arm64"] {
				t.Errorf("platforms %v, want amd64 and arm64", seen)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(release, "metalvip-0.1.0.tgz")); err != nil {
		t.Errorf("no chart package: %v", err)
	}
}

// checkImage: the config says the platform, user and entrypoint; the one layer holds the
// binary, built for that machine; on this machine's architecture it runs and says its build.
func checkImage(t *testing.T, im Image, img v1.Image, p *v1.Platform, version, commit string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	entry := "/usr/local/bin/" + im.Binary
	if cf.OS != "linux" || cf.Architecture != p.Architecture || cf.Config.User != im.User ||
		len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != entry {
		t.Errorf("%s config: os %s arch %s user %q entrypoint %v", p.Architecture, cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("version label %q, want %q", got, version)
	}
	bin := extract(t, img, strings.TrimPrefix(entry, "/"))
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s %s: not an ELF file: %v", im.Binary, p.Architecture, err)
	}
	if f.Machine != machines[p.Architecture] {
		t.Errorf("%s %s: ELF machine %s, want %s", im.Binary, p.Architecture, f.Machine, machines[p.Architecture])
	}
	if p.Architecture != "amd64" {
		return
	}
	path := filepath.Join(t.TempDir(), im.Binary)
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", im.Binary, err, out)
	}
	want := im.Binary + " " + version + " (commit " + commit + ", "
	if !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "linux/amd64)") {
		t.Errorf("%s --version printed %q, want %q... linux/amd64)", im.Binary, out, want)
	}
}

// checkTarball: the per-platform tarball for `ctr images import` is the same image (same
// config, so the same image ID, and the same layer), named as install.yaml names it. Its
// manifest is not the same bytes: the docker save format has none and it is rebuilt on load.
func checkTarball(t *testing.T, im Image, desc v1.Descriptor, pulled v1.Image) {
	t.Helper()
	path := filepath.Join(repoRoot, "_output", "images", "linux-"+desc.Platform.Architecture, im.Binary+".tar")
	tag, err := name.NewTag("ghcr.io/metalvip/" + im.Binary + ":v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("%s: %v (tagged as %s?)", path, err, tag)
	}
	got, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := pulled.ConfigName()
	if got != want {
		t.Errorf("%s holds the image %s, the index's %s image is %s", path, got, desc.Platform.Architecture, want)
	}
	gotLayers, _ := img.Layers()
	wantLayers, _ := pulled.Layers()
	if len(gotLayers) != 1 || len(wantLayers) != 1 {
		t.Fatalf("%s: %d layers, pulled %d", path, len(gotLayers), len(wantLayers))
	}
	if a, b := mustDiffID(t, gotLayers[0]), mustDiffID(t, wantLayers[0]); a != b {
		t.Errorf("%s: layer %s, pulled %s", path, a, b)
	}
}

func extract(t *testing.T, img v1.Image, file string) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("the layer has no %s", file)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == file {
			if h.Uid != 0 || h.Mode&0o755 != 0o755 {
				t.Errorf("%s: uid %d mode %o", file, h.Uid, h.Mode)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// The same binaries always give the same digests: a rebuild that changes nothing pushes
// nothing new, and a digest in install.yaml can be checked by building again.
func TestTheSameBinariesGiveTheSameDigests(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	for _, arch := range []string{"amd64", "arm64"} {
		for i, im := range Images {
			dir := filepath.Join(bin, "linux_"+arch)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			// Any bytes do: the packing is under test, not the binaries.
			if err := os.WriteFile(filepath.Join(dir, im.Binary), []byte(arch+im.Binary+string(rune('a'+i))), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	build := func(out string) []Built {
		b, err := Build(BuildOptions{
			BinDir: bin, OutDir: out, Repository: "example.test/metalvip", Tag: "v1", Version: "v1", Revision: "r",
			Platforms: []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first, second := build(t.TempDir()), build(t.TempDir())
	for i := range first {
		if first[i].Digest != second[i].Digest {
			t.Errorf("%s: %s then %s", first[i].Binary, first[i].Digest, second[i].Digest)
		}
	}
	// And a different binary gives a different digest.
	if err := os.WriteFile(filepath.Join(bin, "linux_arm64", "metalvip-agent"), []byte("changed"), 0o755); err != nil {
		t.Fatal(err)
	}
	thirdOut := t.TempDir()
	third := build(thirdOut)
	if third[1].Digest == first[1].Digest {
		t.Error("a changed arm64 agent kept the agent index's digest")
	}
	if third[0].Digest != first[0].Digest {
		t.Error("a changed agent changed the CCM's digest")
	}
	// The build's own tag: the same for the same binaries, another for a changed one, on
	// every image; each tarball names both tags.
	if first[0].BuildRef != second[0].BuildRef || first[0].BuildRef.TagStr() != first[1].BuildRef.TagStr() {
		t.Errorf("build tags %s, %s (again), %s (the agent's); want one, the same twice", first[0].BuildRef, second[0].BuildRef, first[1].BuildRef)
	}
	if third[0].BuildRef.TagStr() == first[0].BuildRef.TagStr() || !strings.HasPrefix(third[0].BuildRef.TagStr(), "v1-") {
		t.Errorf("a changed agent's build tag %s, before %s: want another, after the release's", third[0].BuildRef.TagStr(), first[0].BuildRef.TagStr())
	}
	tags, err := tarballTags(filepath.Join(thirdOut, "linux-amd64", "metalvip-agent.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"example.test/metalvip/metalvip-agent:v1", "example.test/metalvip/metalvip-agent:" + third[1].BuildRef.TagStr()}; !slices.Equal(tags, want) {
		t.Errorf("the agent's tarball names %v; want %v", tags, want)
	}
}

// tarballTags reads the image names a docker-archive tarball gives (its manifest.json).
func tarballTags(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: no manifest.json: %w", path, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return nil, err
		}
		var tags []string
		for _, e := range m {
			tags = append(tags, e.RepoTags...)
		}
		slices.Sort(tags)
		return tags, nil
	}
}

func TestBuildRefusesAMissingBinaryByPath(t *testing.T) {
	_, err := Build(BuildOptions{BinDir: t.TempDir(), OutDir: t.TempDir(), Repository: "example.test/m", Tag: "v1",
		Platforms: []v1.Platform{{OS: "linux", Architecture: "riscv64"}}})
	if err == nil || !strings.Contains(err.Error(), filepath.Join("linux_riscv64", "metalvip-cloud-controller-manager")) {
		t.Fatalf("Build: %v", err)
	}
}

func TestPushRefusesALayoutWithoutNamedImages(t *testing.T) {
	dir := t.TempDir()
	if _, err := layout.Write(dir, emptyIndex(t)); err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	if _, err := Push(dir, strings.TrimPrefix(reg.URL, "http://")+"/m"); err == nil || !strings.Contains(err.Error(), "no named image index") {
		t.Fatalf("Push: %v", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func pinOf(t *testing.T, pins, binary string) string {
	t.Helper()
	for _, l := range strings.Split(pins, "\n") {
		if b, ref, ok := strings.Cut(l, "="); ok && b == binary {
			return ref
		}
	}
	t.Fatalf("images.txt has no %s:\n%s", binary, pins)
	return ""
}

func layoutDigests(t *testing.T, lp layout.Path) map[string]string {
	t.Helper()
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range m.Manifests {
		ref := d.Annotations[refAnnotation]
		binary := ref[strings.LastIndex(ref, "/")+1 : strings.LastIndex(ref, ":")]
		out[binary] = d.Digest.String()
	}
	return out
}

func emptyIndex(t *testing.T) v1.ImageIndex {
	t.Helper()
	return empty.Index
}

func mustDiffID(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	h, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// packSingle runs `images single` on a stand-in binary called binary, packed as ref with more
// flags, and returns the image and its configuration, and the binary's and tarball's paths.
func packSingle(t *testing.T, binary, ref string, more ...string) (v1.Image, *v1.ConfigFile, string, string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, binary)
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, binary+".tar")
	if err := singleCommand(append([]string{"-bin", bin, "-ref", ref, "-out", out}, more...)); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(ref)
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("the tarball does not hold %s: %v", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return img, cf, bin, out
}

func TestSinglePacksOneBinaryUnderTheGivenName(t *testing.T) {
	_, cf, bin, out := packSingle(t, "httpd", "example.test/httpd:v1", "-platform", "linux/arm64")
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/usr/local/bin/httpd" || cf.Architecture != "arm64" || cf.Config.User != "65532:65532" {
		t.Errorf("entrypoint %q, architecture %q, user %q; want /usr/local/bin/httpd, arm64, 65532:65532", got, cf.Architecture, cf.Config.User)
	}
	if err := singleCommand([]string{"-bin", bin, "-ref", "Not A Ref", "-out", out}); err == nil || !strings.Contains(err.Error(), "-ref") {
		t.Errorf("a bad -ref gave %v, want an error naming -ref", err)
	}
}

func TestSingleLinksTheBinaryUnderEveryNameAndSetsTheDefaultArguments(t *testing.T) {
	img, cf, bin, out := packSingle(t, "agnhost", "example.test/agnhost:2", "-user", "0:0",
		"-links", "/agnhost,/bin/sh,/usr/local/bin/nc", "-cmd", "pause")
	if got := strings.Join(cf.Config.Cmd, " "); got != "pause" || cf.Config.User != "0:0" {
		t.Errorf("cmd %q, user %q; want pause, 0:0", got, cf.Config.User)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	links := map[string]string{}
	dirs := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			links[h.Name] = h.Linkname
		case tar.TypeDir:
			dirs[h.Name] = true
		}
	}
	for _, l := range []string{"agnhost", "bin/sh", "usr/local/bin/nc"} {
		if links[l] != "/usr/local/bin/agnhost" {
			t.Errorf("%s links to %q, want /usr/local/bin/agnhost", l, links[l])
		}
	}
	if !dirs["bin"] {
		t.Errorf("no bin/ directory for /bin/sh: %v", dirs)
	}
	if err := singleCommand([]string{"-bin", bin, "-ref", "example.test/agnhost:2", "-out", out, "-links", "bin/sh"}); err == nil || !strings.Contains(err.Error(), "-links") {
		t.Errorf("a relative link gave %v, want an error naming -links", err)
	}
}
