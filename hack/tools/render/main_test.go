package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
const digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

func TestParseReference(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     reference
		err      string
	}{
		{"a name with a tag keeps both", "ghcr.io/metalvip/metalvip-agent:v0.1.0", reference{name: "ghcr.io/metalvip/metalvip-agent", tag: "v0.1.0"}, ""},
		{"a registry port is not a tag", "127.0.0.1:5000/metalvip/metalvip-agent", reference{name: "127.0.0.1:5000/metalvip/metalvip-agent"}, ""},
		{"a digest after a port is the digest", "127.0.0.1:5000/m/metalvip-agent@" + digestA, reference{name: "127.0.0.1:5000/m/metalvip-agent", digest: digestA}, ""},
		{"a short digest is refused", "r/m@sha256:abc", reference{}, "64 lower-case hex"},
		{"a digest of another algorithm is refused", "r/m@sha512:" + strings.Repeat("a", 64), reference{}, "sha256"},
		{"an empty name is refused", ":v1", reference{}, "not an image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseReference(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseReference(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseReference(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

// The real manifests, rendered with pins: every image is the pinned digest and nothing else
// changes.
func TestARenderPinsEveryImageByDigestAndChangesNothingElse(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "manifests")
	plain, err := Render(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	pins := []pin{
		{"metalvip-cloud-controller-manager", reference{name: "127.0.0.1:5000/rel/metalvip-cloud-controller-manager", digest: digestA}},
		{"metalvip-agent", reference{name: "127.0.0.1:5000/rel/metalvip-agent", digest: digestB}},
	}
	pinned, err := Render(dir, pins)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{pins[0].ref.String(), pins[1].ref.String()}
	if got := images(pinned); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("pinned images %v, want %v", got, want)
	}
	if got := images(plain); len(got) != 2 || !strings.HasPrefix(got[0], "ghcr.io/metalvip/metalvip-cloud-controller-manager:") {
		t.Errorf("plain images %v", got)
	}
	// Apart from the header and the image lines, the two renders are the same.
	if withoutImages(plain) != withoutImages(pinned) {
		t.Error("pinning changed more than the image lines")
	}
	// The committed install.yaml is this render (make generate writes it; CI checks it).
	committed, err := os.ReadFile(filepath.Join(dir, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(committed) != string(plain) {
		t.Error("manifests/install.yaml is not the render of manifests/: run make generate")
	}
}

func TestReadPinsRefusesWhatIsNotARelease(t *testing.T) {
	for _, tc := range []struct{ name, file, err string }{
		{"a line without = is refused with its number", "metalvip-agent\n", ":1: want binary=reference"},
		{"an image by tag is refused", "metalvip-agent=r/metalvip-agent:v1\n", "not pinned by digest"},
		{"an empty file is refused", "# nothing\n", "names no image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "images.txt")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := readPins(path); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("readPins: %v, want an error with %q", err, tc.err)
			}
		})
	}
}

func TestAnImageWithNoEntryInTheKustomizationIsRefused(t *testing.T) {
	_, err := Render(filepath.Join("..", "..", "..", "manifests"), []pin{{"metalvip-speaker", reference{name: "r/metalvip-speaker", digest: digestA}}})
	if err == nil || !strings.Contains(err.Error(), "no image of metalvip-speaker") {
		t.Fatalf("Render: %v", err)
	}
}

func TestChartValuesPinBothImagesInOneRegistry(t *testing.T) {
	v, err := chartValues([]pin{
		{"metalvip-cloud-controller-manager", reference{name: "reg.example:5000/rel/metalvip-cloud-controller-manager", digest: digestA}},
		{"metalvip-agent", reference{name: "reg.example:5000/rel/metalvip-agent", digest: digestB}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Image struct{ Registry string }
		CCM   struct{ Image struct{ Digest string } } `json:"ccm"`
		Agent struct{ Image struct{ Digest string } }
	}
	if err := yaml.UnmarshalStrict(v, &got); err != nil {
		t.Fatalf("%v\n%s", err, v)
	}
	if got.Image.Registry != "reg.example:5000/rel" || got.CCM.Image.Digest != digestA || got.Agent.Image.Digest != digestB {
		t.Errorf("values %+v", got)
	}
	if _, err := chartValues([]pin{
		{"metalvip-cloud-controller-manager", reference{name: "a.example/metalvip-cloud-controller-manager", digest: digestA}},
		{"metalvip-agent", reference{name: "b.example/metalvip-agent", digest: digestB}},
	}); err == nil {
		t.Error("two registries were accepted")
	}
}

// A development build's render (make images): both images by the build's own tag, nothing
// else changed; the values name the same tag; a tag that is none is refused.
func TestARenderByTagNamesBothImagesAndChangesNothingElse(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "manifests")
	out := t.TempDir()
	if err := runTag(dir, filepath.Join(out, "install.yaml"), "v0.1.0-0123456789ab", filepath.Join(out, "values.yaml")); err != nil {
		t.Fatal(err)
	}
	tagged, err := os.ReadFile(filepath.Join(out, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Render(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ghcr.io/metalvip/metalvip-cloud-controller-manager:v0.1.0-0123456789ab", "ghcr.io/metalvip/metalvip-agent:v0.1.0-0123456789ab"}
	if got := images(tagged); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("images %v, want %v", got, want)
	}
	if withoutImages(plain) != withoutImages(tagged) {
		t.Error("the tag changed more than the image lines")
	}
	values, err := os.ReadFile(filepath.Join(out, "values.yaml"))
	if err != nil || !strings.Contains(string(values), "image:\n  tag: v0.1.0-0123456789ab\n") {
		t.Errorf("values %q (%v), want image.tag set", values, err)
	}
	for _, bad := range []string{"v0.1.0 x", "-x", "a/b", strings.Repeat("a", 129)} {
		if err := runTag(dir, filepath.Join(out, "x.yaml"), bad, ""); err == nil {
			t.Errorf("tag %q taken", bad)
		}
	}
}

// images lists a render's image references, in order.
func images(b []byte) []string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "image: ") {
			out = append(out, strings.TrimPrefix(s, "image: "))
		}
	}
	return out
}

// withoutImages is a render without its header and its image lines.
func withoutImages(b []byte) string {
	var keep []string
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if !strings.Contains(l, "image: ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
