// Package images checks `make images`: tarballs a container runtime can load, whose config
// names the right entrypoint, and whose binary runs.
package images

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metalvip/metalvip/test/testenv"
)

func TestMakeImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images; not run with -short")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "images", "IMAGE_TAG=v0.0.0-test")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make images: %v\n%s", err, out)
	}
	for _, tc := range []struct{ binary, user string }{
		{"metalvip-cloud-controller-manager", "65532:65532"},
		{"metalvip-agent", "0:0"},
	} {
		t.Run(tc.binary, func(t *testing.T) {
			files := readTar(t, filepath.Join(root, "_output", "images", tc.binary+".tar"))
			var manifest []struct {
				Config   string
				RepoTags []string
				Layers   []string
			}
			if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
				t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
			}
			m := manifest[0]
			if len(m.RepoTags) != 1 || m.RepoTags[0] != "ghcr.io/metalvip/"+tc.binary+":v0.0.0-test" {
				t.Errorf("tags %v", m.RepoTags)
			}
			var cfg struct {
				OS, Architecture string
				Config           struct {
					Entrypoint []string
					User       string
					Labels     map[string]string
				}
			}
			if err := json.Unmarshal(files[m.Config], &cfg); err != nil {
				t.Fatal(err)
			}
			want := "/usr/local/bin/" + tc.binary
			if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != want {
				t.Errorf("entrypoint %v, want [%s]", cfg.Config.Entrypoint, want)
			}
			if cfg.Config.User != tc.user || cfg.OS != "linux" || cfg.Config.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
				t.Errorf("config %+v", cfg)
			}
			// Unpack the binary from the layer and run it.
			if len(m.Layers) != 1 {
				t.Fatalf("layers %v", m.Layers)
			}
			bin := extract(t, files[m.Layers[0]], strings.TrimPrefix(want, "/"))
			path := filepath.Join(t.TempDir(), tc.binary)
			if err := os.WriteFile(path, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(path, "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("%s --help: %v\n%s", tc.binary, err, out)
			}
			if !strings.Contains(string(out), "sage") {
				t.Errorf("%s --help printed no flags:\n%s", tc.binary, out)
			}
		})
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return readTarStream(t, f)
}

func readTarStream(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func extract(t *testing.T, layer []byte, name string) []byte {
	t.Helper()
	zr, err := gzip.NewReader(strings.NewReader(string(layer)))
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	files := readTarStream(t, zr)
	b, ok := files[name]
	if !ok {
		t.Fatalf("layer has no %s", name)
	}
	return b
}
