// Command images packs metalvip's container images without any container daemon
// (go-containerregistry) and pushes them. `make images` and `make release` run it.
//
//	images build -bin DIR -out DIR -platforms "linux/amd64 linux/arm64" -repository R -tag T
//	images push -layout DIR/oci -registry REGISTRY
//	images single -bin FILE -ref REF -out FILE.tar [-user U] [-platform P] [-links /bin/sh,...] [-cmd ARG,...]
//
// build takes the static binaries the Makefile cross-compiled (DIR/<os>_<arch>/<binary>) and
// writes, per binary, a multi-architecture OCI image index: into an OCI layout (DIR/oci, each
// index named by its reference) and as one tarball per platform (DIR/<os>-<arch>/<binary>.tar,
// the `docker save` format that `ctr -n k8s.io images import`, `docker load` and `podman load`
// take). Every image is the binary alone on an empty base, with its entrypoint, user and
// labels; timestamps are fixed, so the same binaries give the same digests.
//
// single packs one static binary the same way into one tarball named REF: the test images the
// cluster harness (test/kubecluster) imports into its nodes (a pause image, an HTTP server).
//
// push sends every index of the layout to REGISTRY/<binary>:<tag> and prints
// binary=REGISTRY/<binary>@sha256:... per line, which `render -images` pins in a release.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image is one of metalvip's images: the binary it runs and how.
type Image struct {
	Binary, User, Description string
	// Links are absolute paths in the image that link to the binary (a multi-call binary run by
	// the name it is called with); Cmd is the image's default arguments.
	Links, Cmd []string
}

// Images are the images a release ships. The agent runs as root with two capabilities only
// (manifests/agent/daemonset.yaml says why); the CCM as an unprivileged user.
var Images = []Image{
	{Binary: "metalvip-cloud-controller-manager", User: "65532:65532", Description: "metalvip's cloud-controller-manager: LoadBalancer addresses for bare metal"},
	{Binary: "metalvip-agent", User: "0:0", Description: "metalvip's node agent: announces VIPs by ARP/NDP and BGP (needs NET_RAW and NET_ADMIN)"},
}

// refAnnotation names an index in the OCI layout, as the image-spec defines it.
const refAnnotation = "org.opencontainers.image.ref.name"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = buildCommand(os.Args[2:])
	case "push":
		err = pushCommand(os.Args[2:])
	case "single":
		err = singleCommand(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "images %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: images build -bin DIR -out DIR [-platforms P] [-repository R] [-tag T] [-version V] [-revision C] [-build-tag-out FILE]\n       images push -layout DIR -registry REGISTRY\n       images single -bin FILE -ref REF -out FILE [-user U] [-platform P] [-links PATHS] [-cmd ARGS]")
	os.Exit(2)
}

func buildCommand(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	var o BuildOptions
	platforms := fs.String("platforms", "linux/amd64 linux/arm64", "space- or comma-separated os/arch list")
	fs.StringVar(&o.BinDir, "bin", "", "folder with <os>_<arch>/<binary> static binaries")
	fs.StringVar(&o.OutDir, "out", "", "folder for the OCI layout (oci/) and the per-platform tarballs")
	fs.StringVar(&o.Repository, "repository", "ghcr.io/metalvip", "image repository prefix the images are named with")
	fs.StringVar(&o.Tag, "tag", "", "image tag")
	fs.StringVar(&o.Version, "version", "", "the binaries' version, for the labels")
	fs.StringVar(&o.Revision, "revision", "", "source revision, for the labels")
	buildTagOut := fs.String("build-tag-out", "", "write the build's own tag (every image's second tag, which changes with any binary) to this file")
	_ = fs.Parse(args)
	if o.BinDir == "" || o.OutDir == "" || o.Tag == "" {
		return errors.New("-bin, -out and -tag are required")
	}
	for _, p := range strings.FieldsFunc(*platforms, func(r rune) bool { return r == ' ' || r == ',' }) {
		plat, err := v1.ParsePlatform(p)
		if err != nil || plat.OS == "" || plat.Architecture == "" {
			return fmt.Errorf("-platforms: %q is not os/arch", p)
		}
		o.Platforms = append(o.Platforms, *plat)
	}
	built, err := Build(o)
	if err != nil {
		return err
	}
	for _, b := range built {
		fmt.Printf("%s@%s (also %s)\n", b.Ref, b.Digest, b.BuildRef.TagStr())
	}
	if *buildTagOut != "" && len(built) > 0 {
		return os.WriteFile(*buildTagOut, []byte(built[0].BuildRef.TagStr()+"\n"), 0o644)
	}
	return nil
}

// BuildOptions say what Build packs and where it writes.
type BuildOptions struct {
	BinDir, OutDir    string
	Platforms         []v1.Platform
	Repository, Tag   string
	Version, Revision string
}

// Built is one image index Build wrote.
type Built struct {
	Binary string
	Ref    name.Tag
	Digest v1.Hash
	// BuildRef names the same image by the build's own tag (BuildTag).
	BuildRef name.Tag
}

// Build writes one image index per binary into OutDir/oci, replacing what was there, and one
// tarball per platform and binary. Each tarball names its image twice: with Tag (the release's,
// the one manifests/install.yaml names) and with BuildTag(Tag, the indexes), which changes
// whenever a binary does, so that a rebuilt tree has a reference of its own to roll out.
func Build(o BuildOptions) ([]Built, error) {
	if len(o.Platforms) == 0 {
		return nil, errors.New("no platform")
	}
	ociDir := filepath.Join(o.OutDir, "oci")
	if err := os.RemoveAll(ociDir); err != nil {
		return nil, err
	}
	lp, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		return nil, err
	}
	type platformImg struct {
		p   v1.Platform
		img v1.Image
	}
	imgs := map[string][]platformImg{}
	var out []Built
	var digests []v1.Hash
	for _, im := range Images {
		ref, err := name.NewTag(o.Repository + "/" + im.Binary + ":" + o.Tag)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", im.Binary, err)
		}
		var adds []mutate.IndexAddendum
		for _, p := range o.Platforms {
			img, err := platformImage(im, p, o)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", im.Binary, p, err)
			}
			imgs[im.Binary] = append(imgs[im.Binary], platformImg{p, img})
			plat := p
			adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
		}
		idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{refAnnotation: ref.String()})); err != nil {
			return nil, err
		}
		d, err := idx.Digest()
		if err != nil {
			return nil, err
		}
		digests = append(digests, d)
		out = append(out, Built{Binary: im.Binary, Ref: ref, Digest: d})
	}
	build := BuildTag(o.Tag, digests)
	for i, b := range out {
		buildRef, err := name.NewTag(o.Repository + "/" + b.Binary + ":" + build)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Binary, err)
		}
		out[i].BuildRef = buildRef
		for _, pi := range imgs[b.Binary] {
			tarPath := filepath.Join(o.OutDir, pi.p.OS+"-"+pi.p.Architecture, b.Binary+".tar")
			if err := os.MkdirAll(filepath.Dir(tarPath), 0o755); err != nil {
				return nil, err
			}
			refs := map[name.Reference]v1.Image{b.Ref: pi.img, buildRef: pi.img}
			if err := tarball.MultiRefWriteToFile(tarPath, refs); err != nil {
				return nil, fmt.Errorf("%s: %w", tarPath, err)
			}
		}
	}
	return out, nil
}

// BuildTag is the tag of one build of every image: tag and the first 12 hex digits of the
// sha256 of the images' index digests, in order ("v0.1.0-3f9c0a1b2c4d"). The same binaries give
// the same tag; any changed binary another.
func BuildTag(tag string, digests []v1.Hash) string {
	h := sha256.New()
	for _, d := range digests {
		h.Write([]byte(d.String() + "\n"))
	}
	return fmt.Sprintf("%s-%x", tag, h.Sum(nil)[:6])
}

func singleCommand(args []string) error {
	fs := flag.NewFlagSet("single", flag.ExitOnError)
	bin := fs.String("bin", "", "the static binary")
	ref := fs.String("ref", "", "the image's name and tag, such as example.test/httpd:v1")
	out := fs.String("out", "", "the tarball to write")
	user := fs.String("user", "65532:65532", "the image's user")
	platform := fs.String("platform", "linux/amd64", "the binary's os/arch")
	links := fs.String("links", "", "comma-separated absolute paths that link to the binary")
	cmd := fs.String("cmd", "", "comma-separated default arguments")
	_ = fs.Parse(args)
	if *bin == "" || *ref == "" || *out == "" {
		return errors.New("-bin, -ref and -out are required")
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return fmt.Errorf("-ref: %w", err)
	}
	plat, err := v1.ParsePlatform(*platform)
	if err != nil || plat.OS == "" || plat.Architecture == "" {
		return fmt.Errorf("-platform: %q is not os/arch", *platform)
	}
	data, err := os.ReadFile(*bin)
	if err != nil {
		return err
	}
	im := Image{Binary: filepath.Base(*bin), User: *user, Description: "a test image of metalvip's cluster harness",
		Links: splitList(*links), Cmd: splitList(*cmd)}
	for _, l := range im.Links {
		if !path.IsAbs(l) || path.Clean(l) != l || l == "/" {
			return fmt.Errorf("-links: %q is not a clean absolute path", l)
		}
	}
	img, err := binaryImage(im, data, *plat, BuildOptions{})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return tarball.WriteToFile(*out, tag, img)
}

// splitList is the comma-separated list s, empty for "".
func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func platformImage(im Image, p v1.Platform, o BuildOptions) (v1.Image, error) {
	data, err := os.ReadFile(filepath.Join(o.BinDir, p.OS+"_"+p.Architecture, im.Binary))
	if err != nil {
		return nil, err
	}
	return binaryImage(im, data, p, o)
}

// binaryImage is the image of one binary for platform p.
func binaryImage(im Image, data []byte, p v1.Platform, o BuildOptions) (v1.Image, error) {
	layer, err := binaryLayer(im.Binary, data, im.Links)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = []string{"/usr/local/bin/" + im.Binary}
	cf.Config.Cmd = im.Cmd
	cf.Config.User = im.User
	cf.Config.Env = []string{"PATH=/usr/local/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       im.Binary,
		"org.opencontainers.image.description": im.Description,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.source":      "https://github.com/metalvip/metalvip",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	return mutate.ConfigFile(img, cf)
}

// binaryLayer is usr/local/bin/<binary>, the links to it and an empty /tmp, owned by root, at
// time zero.
func binaryLayer(binary string, data []byte, links []string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, d := range []struct {
		name string
		mode int64
	}{{"usr/", 0o755}, {"usr/local/", 0o755}, {"usr/local/bin/", 0o755}, {"tmp/", 0o1777}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/" + binary, Mode: 0o755, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	dirs := map[string]bool{"usr/": true, "usr/local/": true, "usr/local/bin/": true, "tmp/": true}
	for _, l := range links {
		name := strings.TrimPrefix(l, "/")
		for i := range name {
			if d := name[:i+1]; name[i] == '/' && !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
					return nil, err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: "/usr/local/bin/" + binary, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

func pushCommand(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	dir := fs.String("layout", "", "the OCI layout `images build` wrote")
	registry := fs.String("registry", "", "where to push: registry.example[:port]/path")
	_ = fs.Parse(args)
	if *dir == "" || *registry == "" {
		return errors.New("-layout and -registry are required")
	}
	pushed, err := Push(*dir, *registry, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return err
	}
	for _, p := range pushed {
		fmt.Printf("%s=%s\n", p.Binary, p.Ref)
	}
	return nil
}

// Pushed is one index sent to a registry, by digest.
type Pushed struct {
	Binary string
	Ref    name.Digest
}

// Push sends every named index of the OCI layout to registry/<binary>:<tag> and checks that
// the registry holds it under the layout's digest.
func Push(dir, registry string, opts ...remote.Option) ([]Pushed, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	root, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []Pushed
	for _, desc := range m.Manifests {
		src, err := name.NewTag(desc.Annotations[refAnnotation])
		if err != nil {
			return nil, fmt.Errorf("layout entry %s has no image name: %w", desc.Digest, err)
		}
		binary := src.RepositoryStr()[strings.LastIndex(src.RepositoryStr(), "/")+1:]
		dst, err := name.NewTag(strings.TrimSuffix(registry, "/") + "/" + binary + ":" + src.TagStr())
		if err != nil {
			return nil, fmt.Errorf("-registry %q: %w", registry, err)
		}
		idx, err := root.ImageIndex(desc.Digest)
		if err != nil {
			return nil, err
		}
		if err := remote.WriteIndex(dst, idx, opts...); err != nil {
			return nil, fmt.Errorf("push %s: %w", dst, err)
		}
		got, err := remote.Head(dst, opts...)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", dst, err)
		}
		if got.Digest != desc.Digest {
			return nil, fmt.Errorf("%s: the registry holds %s, not the pushed %s", dst, got.Digest, desc.Digest)
		}
		out = append(out, Pushed{Binary: binary, Ref: dst.Context().Digest(desc.Digest.String())})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no named image index", dir)
	}
	return out, nil
}
