package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/nodeagent/controlplane"
	"github.com/metalvip/metalvip/test/testenv"
)

// shadowCheckout makes the folder the doc's blocks run in: a link to each of the checkout's
// entries, but for those named in copies, which are copied. What the commands write
// (before.txt, a support bundle, ./controlplane) lands outside the checkout, and the test
// may change a copy (the chart's next version) without touching the checkout.
func (r *docRun) shadowCheckout(copies ...string) string {
	r.t.Helper()
	dir := filepath.Join(r.t.TempDir(), "metalvip")
	if err := os.Mkdir(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	entries, err := os.ReadDir(r.root)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range entries {
		src, dst := filepath.Join(r.root, e.Name()), filepath.Join(dir, e.Name())
		if slices.Contains(copies, e.Name()) {
			if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
				r.t.Fatalf("copy %s: %v\n%s", e.Name(), err, out)
			}
			continue
		}
		if err := os.Symlink(src, dst); err != nil {
			r.t.Fatal(err)
		}
	}
	r.root = dir
	return dir
}

// ctlOnPath puts the metalvipctl this test binary built on the PATH, under both of its names,
// as make build does in bin/.
func (r *docRun) ctlOnPath() {
	r.t.Helper()
	for _, name := range []string{"metalvipctl", "kubectl-metalvip"} {
		if err := os.Symlink(ctlBinary, filepath.Join(r.bin, name)); err != nil {
			r.t.Fatal(err)
		}
	}
}

// rooted maps the host paths a doc's commands name (/etc/..., /var/lib/..., /usr/local/bin)
// into root, the test's stand-in for a machine's file system.
func rooted(text, root string) string {
	return strings.NewReplacer(
		"/etc/metalvip", root+"/etc/metalvip",
		"/etc/kubernetes", root+"/etc/kubernetes",
		"/var/lib/metalvip-agent", root+"/var/lib/metalvip-agent",
		"/usr/local/bin/", root+"/usr/local/bin/",
	).Replace(text)
}

// docSteps reads a doc's blocks and checks that its steps (the args of its run and lines
// blocks, in order) are the ones the test knows.
func docSteps(t *testing.T, doc string, steps ...string) []docBlock {
	t.Helper()
	blocks, err := docBlocks(doc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range blocks {
		if b.kind == "run" || b.kind == "lines" {
			got = append(got, b.arg)
		}
	}
	if !slices.Equal(got, steps) {
		t.Fatalf("%s's steps are %v; the test knows %v", doc, got, steps)
	}
	return blocks
}

func blockOf(t *testing.T, blocks []docBlock, kind, arg string) docBlock {
	t.Helper()
	for _, b := range blocks {
		if b.kind == kind && b.arg == arg {
			return b
		}
	}
	t.Fatalf("no block %s %s", kind, arg)
	return docBlock{}
}

// agentBinary builds metalvip-agent once per test binary (the control-plane guide's key step).
var agentBinary = testenv.Lazy(func() (string, error) {
	dir, err := os.MkdirTemp("", "metalvip-agent-")
	if err != nil {
		return "", err
	}
	return testenv.GoBuild(dir, "./cmd/metalvip-agent")
})

// TestControlPlaneDocWorksAsWritten follows docs/control-plane.md's kubeadm HA steps on three
// stand-in machines (a folder each for /etc and /var/lib): the agent prints each node's key,
// metalvipctl writes the files from them, each file checks with the agent's own rules and its
// static pod runs the image make images tags; standby on and off change the node's file. The
// file shown in the guide checks too.
func TestControlPlaneDocWorksAsWritten(t *testing.T) {
	blocks := docSteps(t, "../../docs/control-plane.md", "keys", "files", "standby")
	r := newDocShell(t)
	r.ctlOnPath()
	root := r.shadowCheckout()
	agent := agentBinary(t)
	if err := os.Symlink(agent, filepath.Join(r.bin, "metalvip-agent")); err != nil {
		t.Fatal(err)
	}

	sample := blockOf(t, blocks, "file", "controlplane.yaml")
	if _, err := controlplane.Parse([]byte(sample.text)); err != nil {
		t.Errorf("the guide's file (line %d) does not check: %v", sample.line, err)
	}

	nodes := []string{"cp1", "cp2", "cp3"}
	machine := map[string]string{}
	keys := map[string]string{}
	keysBlock := blockOf(t, blocks, "lines", "keys")
	for i, n := range nodes {
		machine[n] = t.TempDir()
		for _, l := range commandLines(keysBlock.text) {
			out, err := r.shell(rooted(l, machine[n]))
			if err != nil {
				t.Fatalf("%s on %s: %v\n%s", l, n, err, out)
			}
			keys[fmt.Sprintf("KEY%d", i+1)] = strings.TrimSpace(out)
		}
		if _, err := os.Stat(filepath.Join(machine[n], "var", "lib", "metalvip-agent")); err != nil {
			t.Errorf("the key step kept nothing in the node's state folder: %v", err)
		}
	}

	files := blockOf(t, blocks, "run", "files")
	text := files.text
	for k, v := range keys {
		text = strings.ReplaceAll(text, k, v)
	}
	if text == files.text {
		t.Fatalf("the files step names no KEY1..KEY3:\n%s", files.text)
	}
	r.run(docBlock{kind: "run", arg: "files", text: text, line: files.line})
	agentImage := ""
	for _, img := range manifestImages(t) {
		if strings.Contains(img, "/metalvip-agent:") {
			agentImage = img
		}
	}
	for _, n := range nodes {
		cfg, err := controlplane.Load(filepath.Join(root, "controlplane", n, "controlplane.yaml"))
		if err != nil {
			t.Fatalf("%s's file: %v", n, err)
		}
		if cfg.Self.Name != n || len(cfg.Members) != 3 || len(cfg.Self.Key) == 0 {
			t.Errorf("%s's file is for %s with %d nodes, key %x", n, cfg.Self.Name, len(cfg.Members), cfg.Self.Key)
		}
		data, err := os.ReadFile(filepath.Join(root, "controlplane", n, "metalvip-controlplane.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict(data, &pod); err != nil {
			t.Fatalf("%s's static pod: %v", n, err)
		}
		if got := pod.Spec.Containers[0].Image; got != agentImage {
			t.Errorf("%s's static pod runs %s; make images tags %s", n, got, agentImage)
		}
		// Step 3: place them.
		for src, dst := range map[string]string{"controlplane.yaml": "etc/metalvip", "metalvip-controlplane.yaml": "etc/kubernetes/manifests"} {
			if err := os.MkdirAll(filepath.Join(machine[n], dst), 0o755); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(root, "controlplane", n, src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(machine[n], dst, src), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Upgrading cp1: standby on, then off, in its file.
	standby := func() bool {
		cfg, err := controlplane.Load(filepath.Join(machine["cp1"], "etc", "metalvip", "controlplane.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Standby
	}
	lines := commandLines(blockOf(t, blocks, "lines", "standby").text)
	for i, l := range lines {
		if out, err := r.shell(rooted(l, machine["cp1"])); err != nil {
			t.Fatalf("%s: %v\n%s", l, err, out)
		}
		if want := i < len(lines)-1; standby() != want {
			t.Errorf("after %q the file says standby %v", l, !want)
		}
	}
}
