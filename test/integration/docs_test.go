package integration

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// docBlock is one fenced code block of an install doc with the test marker before it.
type docBlock struct {
	kind, arg string // "run" "certs", "kubeadm-config" "kubeadm-init.yaml", "skip" "(why)", ...
	text      string
	line      int
}

var (
	// Markers and fences may be indented, as in a numbered list.
	markerRE = regexp.MustCompile(`^\s*<!-- test: ([a-z-]+)(?: (.*?))? -->$`)
	fenceRE  = regexp.MustCompile("^(\\s*)```([a-z]*)$")
)

// docBlocks reads every fenced block of a doc with its marker. A block without a marker, a
// marker without a block, or a marker of an unknown kind is an error: the doc cannot grow a
// command the test does not know about.
func docBlocks(path string) ([]docBlock, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks  []docBlock
		pending *docBlock
		inside  *docBlock
		indent  string // the opening fence's, taken off the block's lines
		body    []string
	)
	known := []string{"run", "lines", "file", "kubeadm-config", "kubeadm", "ctr", "skip"}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if inside != nil {
			if strings.TrimSpace(line) == "```" {
				inside.text = strings.Join(body, "\n") + "\n"
				blocks = append(blocks, *inside)
				inside, body = nil, nil
			} else {
				body = append(body, strings.TrimPrefix(line, indent))
			}
			continue
		}
		if m := markerRE.FindStringSubmatch(line); m != nil {
			if !slices.Contains(known, m[1]) {
				return nil, fmt.Errorf("%s:%d: unknown test marker %q (know %v)", path, n, m[1], known)
			}
			if m[1] == "skip" && m[2] == "" {
				return nil, fmt.Errorf("%s:%d: a skip says why", path, n)
			}
			pending = &docBlock{kind: m[1], arg: m[2], line: n}
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			if pending == nil {
				return nil, fmt.Errorf("%s:%d: a code block without a test marker before it", path, n)
			}
			inside, pending, indent = pending, nil, m[1]
			inside.line = n
			continue
		}
		if pending != nil && strings.TrimSpace(line) != "" {
			return nil, fmt.Errorf("%s:%d: the test marker at line %d is not followed by a code block", path, n, pending.line)
		}
	}
	if inside != nil {
		return nil, fmt.Errorf("%s: the code block at line %d does not end", path, inside.line)
	}
	return blocks, sc.Err()
}

func TestDocBlocksRefusesUnmarkedAndUnknownBlocks(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"an unmarked block is refused", "text\n```sh\nrm -rf /\n```\n", "without a test marker"},
		{"an unknown marker is refused", "<!-- test: maybe -->\n```sh\nls\n```\n", "unknown test marker"},
		{"a skip without a reason is refused", "<!-- test: skip -->\n```sh\nls\n```\n", "says why"},
		{"a marker followed by prose is refused", "<!-- test: run x -->\nprose\n```sh\nls\n```\n", "not followed by a code block"},
		{"an unmarked block in a list is refused", "1. **Step**:\n\n   ```sh\n   rm -rf /\n   ```\n", "without a test marker"},
		{"an unmarked block without a language is refused", "```\n$ metalvipctl status\n```\n", "without a test marker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "doc.md")
			if err := os.WriteFile(path, []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := docBlocks(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("docBlocks: %v, want %q", err, tc.want)
			}
		})
	}
}

// docRun is one run of an install doc: a fresh API server, a fresh home, the tools on PATH.
type docRun struct {
	t    *testing.T
	srv  *kubeapi.Server
	home string
	env  []string
	root string // where the blocks run: the checkout, or a shadow of it
	bin  string // the operator's tools, first on PATH
}

func newDocRun(t *testing.T, tools ...string) *docRun {
	t.Helper()
	kubeapi.Get(t) // the skip rule, and a check that the binaries are there
	srv := kubeapi.Own(t)
	r := newDocShell(t, append([]string{"kubectl"}, tools...)...)
	r.srv = srv
	if err := os.MkdirAll(filepath.Join(r.home, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(srv.Kubeconfig(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.home, ".kube", "config"), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// newDocShell is a docRun without an API server: a fresh home and the named tools on PATH.
func newDocShell(t *testing.T, tools ...string) *docRun {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &docRun{t: t, home: t.TempDir(), root: root}
	// The operator's tools: kubectl (and helm) of the right versions on PATH; Go's caches as
	// they are (a fresh home must not mean a cold build).
	bin := t.TempDir()
	r.bin = bin
	for _, name := range tools {
		if err := os.Symlink(tool(t, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	goenv, err := exec.Command("go", "env", "-json", "GOCACHE", "GOMODCACHE", "GOPATH", "GOFLAGS", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	var vars map[string]string
	if err := json.Unmarshal(goenv, &vars); err != nil {
		t.Fatal(err)
	}
	r.env = []string{"HOME=" + r.home, "PATH=" + bin + ":" + os.Getenv("PATH"), "TMPDIR=" + t.TempDir(), "LANG=C"}
	for k, v := range vars {
		r.env = append(r.env, k+"="+v)
	}
	return r
}

// run runs a doc block with bash in the checkout, as the operator would, in one shell session
// across blocks: what a block exports (PATH) or where it changes to holds for the next.
func (r *docRun) run(b docBlock) string {
	r.t.Helper()
	start := time.Now()
	out, err := r.shell(b.text)
	if err != nil {
		r.t.Fatalf("block %q (line %d) failed: %v\n--- block\n%s--- output\n%s", b.arg, b.line, err, b.text, out)
	}
	r.t.Logf("block %q (line %d): %s", b.arg, b.line, time.Since(start).Round(10*time.Millisecond))
	return out
}

// shell runs text with bash in the doc's shell session and returns its combined output.
func (r *docRun) shell(text string) (string, error) {
	session := filepath.Join(r.home, ".doc-session")
	script := fmt.Sprintf("[ -f %[1]q ] && source %[1]q\n%[2]s\n{ export -p; printf 'cd %%q\\n' \"$PWD\"; } > %[1]q\n", session, text)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = r.root
	cmd.Env = r.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubeadmConfig writes a kubeadm configuration block to ~/FILE and has kubeadm validate it.
func (r *docRun) kubeadmConfig(b docBlock, validated map[string]bool) {
	r.t.Helper()
	path := filepath.Join(r.home, b.arg)
	if err := os.WriteFile(path, []byte(b.text), 0o644); err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(tool(r.t, "kubeadm"), "config", "validate", "--config", path)
	cmd.Env = r.env
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("kubeadm config validate %s (line %d): %v\n%s", b.arg, b.line, err, out)
	}
	validated[b.arg] = true
}

// kubeadmCommands: each command is kubeadm init or join with a configuration validated above.
func (r *docRun) kubeadmCommands(b docBlock, validated map[string]bool) {
	r.t.Helper()
	re := regexp.MustCompile(`^(sudo )?kubeadm (init|join) --config (\S+)\s*(#.*)?$`)
	seen := map[string]bool{}
	for _, l := range commandLines(b.text) {
		m := re.FindStringSubmatch(l)
		if m == nil {
			r.t.Errorf("line %d: %q is not `kubeadm init|join --config FILE`", b.line, l)
			continue
		}
		if !validated[m[3]] {
			r.t.Errorf("line %d: kubeadm %s --config %s: no block of the doc writes that file", b.line, m[2], m[3])
		}
		seen[m[2]] = true
	}
	if !seen["init"] || !seen["join"] {
		r.t.Errorf("line %d: want both kubeadm init and kubeadm join", b.line)
	}
}

// ctrImports: each command imports a tarball `make images` wrote into containerd's k8s.io
// namespace, and together they import exactly the images the manifests name (each tarball also
// names its image by the build's own tag, `make images`, which the manifests do not name:
// that one is left out).
// buildTag matches an image named by a build's own tag (hack/tools/images BuildTag).
var buildTag = regexp.MustCompile(`:v[^:/]*-[0-9a-f]{12}$`)

func (r *docRun) ctrImports(b docBlock, want []string) {
	r.t.Helper()
	re := regexp.MustCompile(`^(sudo )?ctr -n k8s\.io images import (\S+)\s*(#.*)?$`)
	var got []string
	for _, l := range commandLines(b.text) {
		m := re.FindStringSubmatch(l)
		if m == nil {
			r.t.Errorf("line %d: %q is not `ctr -n k8s.io images import FILE` (the kubelet reads namespace k8s.io only)", b.line, l)
			continue
		}
		// make test builds the images for the host's platform only.
		for _, tag := range repoTags(r.t, filepath.Join(r.root, "_output", "images", "linux-"+runtime.GOARCH, filepath.Base(m[2]))) {
			if !buildTag.MatchString(tag) {
				got = append(got, tag)
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		r.t.Errorf("line %d: the ctr lines import %v; the manifests name %v", b.line, got, want)
	}
}

func commandLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// repoTags reads the names a docker-save tarball gives its image (manifest.json).
func repoTags(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (make images writes it)", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s has no manifest.json", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil || len(m) != 1 {
			t.Fatalf("%s manifest.json: %v", path, err)
		}
		return m[0].RepoTags
	}
}

// manifestImages are the images install.yaml's workloads run.
func manifestImages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, d := range manifestDocs(t) {
		containers, _, _ := unstructuredSlice(d.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			out = append(out, c.(map[string]any)["image"].(string))
		}
	}
	return out
}

func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[f]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}

// startInstalledCCM runs the CCM binary as the installed Deployment would: its arguments,
// the cloud-config from its ConfigMap, the TLS files from its Secret and a token of its
// ServiceAccount (delegated authentication and authorization through it too, as in a pod).
// Only the listening address is the test's: no kubelet runs here.
func (r *docRun) startInstalledCCM(ns string) *testenv.Proc {
	t := r.t
	t.Helper()
	ctx := context.Background()
	c := r.srv.Client
	d, err := c.AppsV1().Deployments(ns).Get(ctx, "metalvip-cloud-controller-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the installed Deployment: %v", err)
	}
	pod := d.Spec.Template.Spec
	dir := t.TempDir()
	var args []string
	for _, a := range pod.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--cloud-config="):
			args = append(args, "--cloud-config="+filepath.Join(dir, "cloud-config.yaml"))
		case strings.HasPrefix(a, "--secure-port="):
			args = append(args, fmt.Sprintf("--secure-port=%d", testenv.FreePort(t)))
		case strings.HasPrefix(a, "--bind-address="):
			args = append(args, "--bind-address=127.0.0.1")
		default:
			args = append(args, a)
		}
	}
	for _, v := range pod.Volumes {
		switch {
		case v.ConfigMap != nil:
			cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the CCM's ConfigMap: %v", err)
			}
			text := strings.ReplaceAll(cm.Data["cloud-config.yaml"], "/etc/metalvip/tls/", filepath.Join(dir, "tls")+"/")
			if err := os.WriteFile(filepath.Join(dir, "cloud-config.yaml"), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		case v.Secret != nil:
			sec, err := c.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the CCM's TLS Secret (the docs' certificates step makes it): %v", err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o700); err != nil {
				t.Fatal(err)
			}
			for k, data := range sec.Data {
				if err := os.WriteFile(filepath.Join(dir, "tls", k), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	tok, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, pod.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrInt64(3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s: %v", pod.ServiceAccountName, err)
	}
	cfg := rest.CopyConfig(r.srv.Config)
	cfg.BearerToken = tok.Status.Token
	kc := r.srv.Kubeconfig(t, cfg)
	args = append(args, "--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc)
	return testenv.StartProc(t, "ccm", exec.Command(ccmBinary, args...))
}

// Nodes as kubeadm's kubelets register them with --cloud-provider=external: tainted until a
// CCM initialises them; the control-plane node labelled as kubeadm labels it. Their addresses
// are on loopback, where nothing answers the installed CCM's calls to their agents: no packet
// leaves the machine.
func (r *docRun) kubeadmNodes() {
	r.t.Helper()
	cp := map[string]string{"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": "", "node.kubernetes.io/exclude-from-external-load-balancers": ""}
	for _, n := range []struct {
		name, ip string
		labels   map[string]string
	}{
		{"cp-1", "127.0.0.11", cp},
		{"worker-1", "127.0.0.12", map[string]string{"kubernetes.io/os": "linux"}},
	} {
		_, err := r.srv.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels, Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: n.ip}},
			Spec:       corev1.NodeSpec{Taints: []corev1.Taint{uninitializedTaint()}},
		}, metav1.CreateOptions{})
		if err != nil {
			r.t.Fatal(err)
		}
	}
}

// checkInstalled: what the doc's last step promises, read back from the API server.
func (r *docRun) checkInstalled(ccm *testenv.Proc, status string, unlabelled bool) {
	t := r.t
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range []string{"cp-1", "worker-1"} {
		for {
			n, err := r.srv.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if n.Spec.ProviderID == "metalvip://"+name && !hasUninitializedTaint(n) {
				if _, excluded := n.Labels["node.kubernetes.io/exclude-from-external-load-balancers"]; excluded && unlabelled {
					t.Errorf("%s still excluded from load balancers after the doc's label step", name)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not initialised by the installed CCM: %+v\n%s", name, n.Spec, ccm.Tail(20))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	svc, err := r.srv.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Status.LoadBalancer.Ingress) == 0 {
		t.Fatal("Service web has no address")
	}
	ip := netip.MustParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
	if !netip.MustParsePrefix("203.0.113.0/26").Contains(ip) {
		t.Errorf("Service web got %s, outside the doc's pool", ip)
	}
	if !strings.Contains(status, ip.String()) || !strings.Contains(status, "default/web") {
		t.Errorf("metalvipctl status does not show default/web with %s:\n%s", ip, status)
	}
	if out := ccm.Output(); strings.Contains(out, "forbidden") {
		t.Errorf("the installed CCM was refused something:\n%s", grepLines(out, "forbidden", 5))
	}
}

func grepLines(text, substr string, n int) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// followDoc runs an install doc's blocks in order on a fresh API server with two kubeadm-like
// nodes, starts the CCM as installed after its install step, and checks what the doc promises.
func followDoc(t *testing.T, doc string, tools []string, steps []string) *docRun {
	t.Helper()
	blocks, err := docBlocks(doc)
	if err != nil {
		t.Fatal(err)
	}
	r := newDocRun(t, tools...)
	r.kubeadmNodes()
	validated := map[string]bool{}
	var ccm *testenv.Proc
	var status string
	var ran []string
	for _, b := range blocks {
		switch b.kind {
		case "run":
			out := r.run(b)
			ran = append(ran, b.arg)
			switch b.arg {
			case "install":
				ccm = r.startInstalledCCM("kube-system")
			case "check":
				status = out
				t.Logf("the check step printed:\n%s", out)
			}
		case "file":
			if err := os.WriteFile(filepath.Join(r.home, b.arg), []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
		case "kubeadm-config":
			r.kubeadmConfig(b, validated)
		case "kubeadm":
			r.kubeadmCommands(b, validated)
		case "ctr":
			r.ctrImports(b, manifestImages(t))
		case "skip":
			t.Logf("skipped the block at line %d: %s", b.line, b.arg)
		}
	}
	if !slices.Equal(ran, steps) {
		t.Fatalf("the doc's steps are %v; the test knows %v", ran, steps)
	}
	r.checkInstalled(ccm, status, slices.Contains(ran, "exclusion"))
	return r
}

// TestInstallKubeadmDocWorksAsWritten follows docs/install-kubeadm.md command by command.
func TestInstallKubeadmDocWorksAsWritten(t *testing.T) {
	followDoc(t, "../../docs/install-kubeadm.md", nil, []string{"build", "exclusion", "install", "pool", "check"})
}

// TestInstallHelmDocWorksAsWritten follows docs/install-helm.md with Helm built from its Go
// module: install, check, and an upgrade.
func TestInstallHelmDocWorksAsWritten(t *testing.T) {
	r := followDoc(t, "../../docs/install-helm.md", []string{"helm"}, []string{"build", "install", "pool", "check", "upgrade"})
	// Installed by Helm (its release Secret, revision 2 after the upgrade), with the values file.
	secs, err := r.srv.Client.CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm,name=metalvip"})
	if err != nil || len(secs.Items) != 2 {
		t.Errorf("Helm release Secrets: %d, %v; want revisions 1 and 2", len(secs.Items), err)
	}
}
