package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/internal/identity"
	"github.com/metalvip/metalvip/test/testenv"
)

// TestInstallHelmDocUpgradesChangedCRDs follows install-helm.md's install and upgrade steps
// across two versions of the chart whose IPPool CRD differs, as at the first release after a
// CRD change. Helm's install owns the CRDs' fields: the doc's upgrade step must bring the
// changed CRD in, and the same step without --force-conflicts stops on the conflict (which is
// why the doc has it).
func TestInstallHelmDocUpgradesChangedCRDs(t *testing.T) {
	blocks := docSteps(t, "../../docs/install-helm.md", "build", "install", "pool", "check", "upgrade")
	r := newDocRun(t, "helm")
	root := r.shadowCheckout("charts")
	for _, b := range blocks {
		if b.kind == "file" {
			if err := os.WriteFile(filepath.Join(r.home, b.arg), []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.run(blockOf(t, blocks, "run", "install"))

	// The chart's next version: a new chart version, and a CRD that says something new.
	const marker = "(chart 0.1.1: a changed description)"
	crdFile := filepath.Join(root, "charts", "metalvip", "crds", "metalvip.io_ippools.yaml")
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	setCRDDescription(t, crd, crdDescription(t, crd)+" "+marker)
	if data, err = yaml.Marshal(crd); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crdFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	chartFile := filepath.Join(root, "charts", "metalvip", "Chart.yaml")
	chart, err := os.ReadFile(chartFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(chartFile, []byte(strings.Replace(string(chart), "\nversion: 0.1.0\n", "\nversion: 0.1.1\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	upgrade := blockOf(t, blocks, "run", "upgrade")
	withoutForce := strings.ReplaceAll(upgrade.text, " --force-conflicts", "")
	if withoutForce == upgrade.text {
		t.Fatalf("the upgrade step has no --force-conflicts:\n%s", upgrade.text)
	}
	out, err := r.shell(withoutForce)
	if err == nil || !strings.Contains(out, "conflict") {
		t.Errorf("without --force-conflicts the upgrade step did not stop on a conflict (%v):\n%s", err, out)
	} else {
		t.Logf("without --force-conflicts, as expected:\n%s", grepLines(out, "onflict", 3))
	}
	r.run(upgrade)

	got, err := apiextensionsClient(t, r).Get(context.Background(), "ippools.metalvip.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := crdDescription(t, got.Object); !strings.Contains(d, marker) {
		t.Errorf("after the doc's upgrade step the IPPool CRD is the first chart's: %q", d)
	}
	secs, err := r.srv.Client.CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm,name=metalvip,version=2"})
	if err != nil || len(secs.Items) != 1 {
		t.Errorf("Helm's revision 2: %d Secrets, %v", len(secs.Items), err)
	}
}

// crdDescription is the description of a CRD's first version's schema.
func crdDescription(t *testing.T, crd map[string]any) string {
	t.Helper()
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	if len(versions) == 0 {
		t.Fatal("a CRD without versions")
	}
	d, _, _ := unstructured.NestedString(versions[0].(map[string]any), "schema", "openAPIV3Schema", "description")
	return d
}

func setCRDDescription(t *testing.T, crd map[string]any, d string) {
	t.Helper()
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	if err := unstructured.SetNestedField(versions[0].(map[string]any), d, "schema", "openAPIV3Schema", "description"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(crd, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
}

func apiextensionsClient(t *testing.T, r *docRun) dynamic.ResourceInterface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(r.srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
}

// metalLBCRDs generates MetalLB's CRDs from its Go API module (hack/tools/metallb pins it), as
// test/migration does, once per test binary.
var metalLBCRDs = testenv.Lazy(func() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "metalvip-metallb-crds-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "tool", "controller-gen", "crd", "paths=go.universe.tf/metallb/api/...", "output:crd:dir="+dir)
	cmd.Dir = filepath.Join(root, "hack", "tools", "metallb")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("generate MetalLB's CRDs with controller-gen: %v\n%s", err, out)
	}
	return dir, nil
})

// metalLBLeft is a Service as MetalLB left it: its annotations and the address in its status.
type metalLBLeft struct {
	name, ip    string
	annotations map[string]string
	port        int32
}

// TestMigratingFromMetalLBDocWorksAsWritten follows docs/migrating-from-metallb.md on an API
// server holding MetalLB's CRDs, its configuration (test/migration's), its controller and
// speaker, and Services with the addresses MetalLB gave them: every step as written, metalvip
// installed with Helm, and the guide's own comparison must find no address changed.
func TestMigratingFromMetalLBDocWorksAsWritten(t *testing.T) {
	blocks := docSteps(t, "../../docs/migrating-from-metallb.md", "record", "crds", "convert", "apply", "stop-metallb", "install", "compare", "tidy")
	r := newDocRun(t, "helm")
	r.ctlOnPath()
	root := r.shadowCheckout()
	ctx := context.Background()
	c := r.srv.Client

	// The cluster as MetalLB runs it.
	if err := r.srv.CreateCRDs(metalLBCRDs(t), "metallb.io"); err != nil {
		t.Fatal(err)
	}
	config, err := os.ReadFile("../migration/testdata/metallb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "metallb-config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "metallb-config", "metallb.yaml"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.shell("kubectl create namespace metallb-system && kubectl apply -f metallb-config/"); err != nil {
		t.Fatalf("MetalLB's configuration: %v\n%s", err, out)
	}
	if _, err := c.CoreV1().Secrets("metallb-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "router-password"},
		Type:       corev1.SecretTypeBasicAuth,
		Data:       map[string][]byte{"password": []byte("docs-test-password")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "metallb"}
	pod := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "metallb", Image: "quay.io/metallb/controller:v0.16.2"}}},
	}
	if _, err := c.AppsV1().Deployments("metallb-system").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "controller"},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: pod},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AppsV1().DaemonSets("metallb-system").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "speaker"},
		Spec:       appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: pod},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.kubeadmNodes()
	left := []metalLBLeft{
		{"web", "203.0.113.5", map[string]string{"metallb.io/ip-allocated-from-pool": "l2-pool"}, 80},
		{"dns-tcp", "203.0.113.9", map[string]string{"metallb.io/allow-shared-ip": "dns", "metallb.io/ip-allocated-from-pool": "l2-pool"}, 53},
		{"dns-udp", "203.0.113.9", map[string]string{"metallb.io/allow-shared-ip": "dns", "metallb.io/ip-allocated-from-pool": "l2-pool"}, 5353},
		{"api", "203.0.113.130", map[string]string{"metallb.universe.tf/address-pool": "bgp-pool", "metallb.universe.tf/ip-allocated-from-pool": "bgp-pool"}, 443},
	}
	for _, s := range left {
		svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Annotations: s.annotations},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": s.name},
				Ports: []corev1.ServicePort{{Port: s.port, TargetPort: intstr.FromInt32(s.port)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.ip}}
		if _, err := c.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	for _, b := range blocks {
		if b.kind != "run" {
			t.Logf("not run, the block at line %d: %s %s", b.line, b.kind, b.arg)
			continue
		}
		if b.arg == "compare" {
			r.waitTakenOver(left)
		}
		out := r.run(b)
		switch b.arg {
		case "convert":
			if !strings.Contains(out, "CHECK:") {
				t.Errorf("the convert step's grep shows no CHECK: the configuration has some:\n%s", out)
			}
			// "Run those commands": the ones the comments give to copy the BGP passwords.
			converted, err := os.ReadFile(filepath.Join(root, "metalvip-config.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			copies := passwordCopyRE.FindAllStringSubmatch(string(converted), -1)
			if len(copies) != 1 {
				t.Fatalf("the conversion gives %d commands to copy a password; the configuration has one Secret", len(copies))
			}
			for _, m := range copies {
				if out, err := r.shell(m[1]); err != nil {
					t.Fatalf("%s: %v\n%s", m[1], err, out)
				}
			}
			if sec, err := c.CoreV1().Secrets("metalvip-bgp-secrets").Get(ctx, "router-password", metav1.GetOptions{}); err != nil {
				t.Errorf("the password Secret the conversion's command copies: %v", err)
			} else if string(sec.Data["password"]) != "docs-test-password" {
				t.Errorf("the copied password is %q", sec.Data["password"])
			}
		case "install":
			r.startInstalledCCM("kube-system")
		case "compare":
			t.Logf("the compare step printed:\n%s", out)
		}
	}

	// What the guide's steps promise, read back.
	pools, err := r.dynamic().Resource(schema.GroupVersionResource{Group: "metalvip.io", Version: "v1alpha1", Resource: "ippools"}).List(ctx, metav1.ListOptions{LabelSelector: "metalvip.io/converted-from=metallb"})
	if err != nil || len(pools.Items) != 3 {
		t.Errorf("converted IPPools: %d, %v; want MetalLB's three", len(pools.Items), err)
	}
	if d, err := c.AppsV1().Deployments("metallb-system").Get(ctx, "controller", metav1.GetOptions{}); err != nil || *d.Spec.Replicas != 0 {
		t.Errorf("MetalLB's controller still scaled up: %v", err)
	}
	if _, err := c.AppsV1().DaemonSets("metallb-system").Get(ctx, "speaker", metav1.GetOptions{}); err == nil {
		t.Error("MetalLB's speakers still there")
	}
	if ns, err := c.CoreV1().Namespaces().Get(ctx, "metalvip-bgp-secrets", metav1.GetOptions{}); err != nil {
		t.Errorf("the password namespace: %v", err)
	} else if ns.Labels["app.kubernetes.io/managed-by"] == "Helm" {
		t.Errorf("Helm took the namespace the guide made by hand: %v", ns.Labels)
	}
	for _, s := range left {
		svc, err := c.CoreV1().Services("default").Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k := range svc.Annotations {
			if strings.HasSuffix(k, "/ip-allocated-from-pool") {
				t.Errorf("%s keeps MetalLB's record %s after the tidy step", s.name, k)
			}
		}
	}
}

// passwordCopyRE finds the commands the conversion's comments give to copy a BGP password.
var passwordCopyRE = regexp.MustCompile(`(?m)^\s*#\s+(kubectl -n metalvip-bgp-secrets create secret .*)$`)

// waitTakenOver waits until the CCM has taken every Service over (its own record), so that the
// guide's comparison compares after the switch-over, not before.
func (r *docRun) waitTakenOver(left []metalLBLeft) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, s := range left {
		for {
			svc, err := r.srv.Client.CoreV1().Services("default").Get(context.Background(), s.name, metav1.GetOptions{})
			if err != nil {
				r.t.Fatal(err)
			}
			if svc.Annotations[string(annotation.AllocatedPool)] != "" {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("%s not taken over by the CCM within 60 s: %v", s.name, svc.Annotations)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func (r *docRun) dynamic() dynamic.Interface {
	r.t.Helper()
	dyn, err := dynamic.NewForConfig(r.srv.Config)
	if err != nil {
		r.t.Fatal(err)
	}
	return dyn
}

// TestOperationsDocWorksAsWritten runs docs/operations.md's commands against an installed
// metalvip (install.yaml, the CCM as installed, a pool, a Service): each line of its "what to
// look at" alone, NODE and NAME standing for a node and a Service; metalvipctl agent reaches
// for the enrolled agent with a viewer's certificate from the CCM (there is no agent here, so
// it fails there, and only there). The completion block runs with /usr/local/bin in the
// test's folder, and kubectl completes the plugin through it.
func TestOperationsDocWorksAsWritten(t *testing.T) {
	blocks := docSteps(t, "../../docs/operations.md", "look", "completion")
	r := newDocRun(t)
	r.ctlOnPath()
	r.shadowCheckout()
	r.kubeadmNodes()
	if out, err := r.shell("kubectl apply --server-side -f manifests/install.yaml"); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	ccm := r.startInstalledCCM("kube-system")
	if out, err := r.shell(`kubectl apply -f docs/examples/ippool.yaml
kubectl create deployment web --image=nginx
kubectl expose deployment web --type=LoadBalancer --port=80
kubectl wait service/web --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' --timeout=2m`); err != nil {
		t.Fatalf("a pool and a Service: %v\n%s\n%s", err, out, ccm.Tail(20))
	}

	look := blockOf(t, blocks, "lines", "look")
	placeholders := strings.NewReplacer("service NAME", "service web", "node NAME", "node worker-1", "NODE", "worker-1")
	ran := 0
	for _, l := range commandLines(look.text) {
		line := placeholders.Replace(l)
		out, err := r.shell(line)
		ran++
		if strings.HasPrefix(line, "metalvipctl agent ") {
			// A viewer's certificate from the CCM (enrolled agents), then the agent's address:
			// nothing listens there.
			if err == nil || strings.Contains(out, "metalvip-viewer-tls") || !strings.Contains(out, "127.0.0.12") {
				t.Errorf("%s: %v; want it to reach for the agent at 127.0.0.12 with a viewer's certificate, not files mode's Secret:\n%s", line, err, out)
			}
			csrs, err := r.srv.Client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			signed := 0
			for _, csr := range csrs.Items {
				if csr.Spec.SignerName == identity.ViewerSigner && len(csr.Status.Certificate) > 0 {
					signed++
				}
			}
			if signed != 1 {
				t.Errorf("%s: %d viewer's certificates signed by the CCM; want 1", line, signed)
			}
			t.Logf("%s (fails: no agent here):\n%s", line, out)
			continue
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", line, err, out)
			continue
		}
		t.Logf("%s:\n%s", line, out)
	}
	if ran < 10 {
		t.Errorf("ran %d lines of the look block; it had 12", ran)
	}
	if m, _ := filepath.Glob(filepath.Join(r.root, "*sysdump*")); len(m) != 1 {
		t.Errorf("metalvipctl sysdump wrote %v in the working folder", m)
	}

	// Completion: the doc's files, in the test's /usr/local/bin, on PATH.
	fs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(fs, "usr", "local", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	completion := blockOf(t, blocks, "lines", "completion")
	for _, l := range commandLines(completion.text) {
		if out, err := r.shell(rooted(l, fs)); err != nil {
			t.Fatalf("%s: %v\n%s", l, err, out)
		}
	}
	out, err := r.shell(fmt.Sprintf("PATH=%q:$PATH kubectl __complete metalvip sta", filepath.Join(fs, "usr", "local", "bin")))
	if err != nil || !strings.Contains(out, "status") {
		t.Errorf("kubectl does not complete metalvip sta to status through the doc's kubectl_complete-metalvip: %v\n%s", err, out)
	}
}
