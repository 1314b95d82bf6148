// Command images builds metalvip's container images as OCI-compatible tarballs (docker save
// format: `docker load`, `podman load`, `ctr images import` take them) without any container
// daemon: each image is the static binary layered on an empty base, with its entrypoint, user
// and labels. `make images` runs it.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type image struct {
	binary, user, description string
}

var images = []image{
	{"metalvip-cloud-controller-manager", "65532:65532", "metalvip's cloud-controller-manager: LoadBalancer addresses for bare metal"},
	{"metalvip-agent", "0:0", "metalvip's node agent: announces VIPs by ARP/NDP and BGP (needs NET_RAW and NET_ADMIN)"},
}

func main() {
	bin := flag.String("bin", "", "folder with the static binaries")
	out := flag.String("out", "", "folder for the image tarballs")
	repo := flag.String("repository", "ghcr.io/metalvip", "image repository prefix")
	version := flag.String("version", "v0.1.0", "image tag")
	revision := flag.String("revision", "", "source revision for the labels")
	flag.Parse()
	if *bin == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "images: -bin and -out are required")
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	for _, im := range images {
		path, err := build(im, *bin, *out, *repo, *version, *revision)
		if err != nil {
			fail(fmt.Errorf("%s: %w", im.binary, err))
		}
		fmt.Println(path)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "images: %v\n", err)
	os.Exit(1)
}

func build(im image, binDir, outDir, repo, version, revision string) (string, error) {
	data, err := os.ReadFile(filepath.Join(binDir, im.binary))
	if err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		epoch := time.Unix(0, 0)
		for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/", "tmp/"} {
			mode := int64(0o755)
			if d == "tmp/" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/" + im.binary, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.Entrypoint = []string{"/usr/local/bin/" + im.binary}
	cf.Config.User = im.user
	cf.Config.Env = []string{"PATH=/usr/local/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       im.binary,
		"org.opencontainers.image.description": im.description,
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.source":      "https://github.com/metalvip/metalvip",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(repo + "/" + im.binary + ":" + version)
	if err != nil {
		return "", err
	}
	path := filepath.Join(outDir, im.binary+".tar")
	return path, tarball.WriteToFile(path, tag, img)
}
