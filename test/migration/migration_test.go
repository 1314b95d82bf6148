// Package migration checks a switch-over from MetalLB against a real kube-apiserver and etcd:
// MetalLB's CRDs, generated from MetalLB's Go API module by controller-gen (nothing of
// MetalLB's repository is copied), hold a MetalLB configuration; metalvipctl migrate metallb
// converts it; the API server accepts what it prints; and the real metalvip CCM, taking over
// Services that carry MetalLB's annotations and the addresses MetalLB gave them, changes none.
package migration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

func TestMain(m *testing.M) { kubeapi.Main(m) }

// tools are the binaries and MetalLB's CRDs, built once per test binary.
type tools struct {
	ctl, ccm, metalLBCRDs string
}

// build builds metalvipctl and the CCM, and generates MetalLB's CRDs from its Go API module
// (hack/tools/metallb pins it) with controller-gen, once.
var build = testenv.Lazy(func() (built tools, err error) {
	dir, err := os.MkdirTemp("", "metalvip-migration-")
	if err != nil {
		return built, err
	}
	if built.ctl, err = testenv.GoBuild(dir, "./cmd/metalvipctl"); err != nil {
		return built, err
	}
	if built.ccm, err = testenv.GoBuild(dir, "./cmd/metalvip-cloud-controller-manager"); err != nil {
		return built, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return built, err
	}
	built.metalLBCRDs = filepath.Join(dir, "metallb-crds")
	start := time.Now()
	cmd := exec.Command("go", "tool", "controller-gen", "crd", "paths=go.universe.tf/metallb/api/...", "output:crd:dir="+built.metalLBCRDs)
	cmd.Dir = filepath.Join(root, "hack", "tools", "metallb")
	if out, err := cmd.CombinedOutput(); err != nil {
		return built, fmt.Errorf("generate MetalLB's CRDs with controller-gen: %v\n%s", err, out)
	}
	fmt.Fprintf(os.Stderr, "MetalLB's CRDs generated from its Go API module in %s\n", time.Since(start).Round(time.Millisecond))
	return built, nil
})

// metalLBResource maps MetalLB's kinds to their resources.
func metalLBResource(u *unstructured.Unstructured) schema.GroupVersionResource {
	gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
	resource := strings.ToLower(u.GetKind()) + "s"
	if u.GetKind() == "Community" {
		resource = "communities"
	}
	return gv.WithResource(resource)
}

// readObjects reads YAML documents.
func readObjects(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decode: %v", err)
		}
		if m != nil {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// run runs a binary and returns its standard output; it fails the test with both outputs.
func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	t.Logf("%s %s: %s", filepath.Base(bin), strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	return stdout.String()
}

const fastConfig = `
allocation:
  pendingRetry: 1s
  poolStatusInterval: 200ms
`

func TestMigrationFromMetalLB(t *testing.T) {
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t) // metalvip's come first, as the switch-over's first step says
	bins := build(t)
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Run("without MetalLB's CRDs the converter says so and prints nothing", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bins.ctl, "migrate", "metallb", "--kubeconfig", srv.Kubeconfig(t, nil))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err == nil || stdout.Len() != 0 || !strings.Contains(stderr.String(), "MetalLB's CRDs are not installed") {
			t.Errorf("exit %v, stdout %q, stderr %q; want a failure saying MetalLB's CRDs are not installed", err, stdout.String(), stderr.String())
		}
	})
	if err := srv.CreateCRDs(bins.metalLBCRDs, "metallb.io"); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"metallb-system", "apps", "team-c"} {
		if _, err := srv.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// MetalLB's configuration, created with unknown fields refused: a field the test data
	// spells wrong, or one MetalLB's API does not have, fails here.
	source := filepath.Join("testdata", "metallb.yaml")
	data, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range readObjects(t, data) {
		if _, err := dyn.Resource(metalLBResource(u)).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
			t.Fatalf("create MetalLB's %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	kubeconfig := srv.Kubeconfig(t, nil)
	printed := run(t, bins.ctl, "migrate", "metallb", "--kubeconfig", kubeconfig)
	t.Logf("printed:\n%s", printed)
	objs := readObjects(t, []byte(printed))

	ok := t.Run("the converter prints the same from files as from the cluster", func(t *testing.T) {
		fromFiles := run(t, bins.ctl, "migrate", "metallb", "-f", source)
		if fromFiles != printed {
			t.Errorf("from %s:\n%s\nfrom the cluster:\n%s", source, fromFiles, printed)
		}
	})
	parent := t // the applied objects outlive the subtest: the CCM uses them
	ok = t.Run("every printed object is accepted by the API server", func(t *testing.T) {
		if len(objs) != 4 {
			t.Fatalf("%d objects printed, want 3 IPPools and 1 BGPPeer", len(objs))
		}
		for _, dryRun := range []bool{true, false} {
			for _, u := range objs {
				res := v1alpha1.IPPoolResource
				if u.GetKind() == "BGPPeer" {
					res = v1alpha1.BGPPeerResource
				}
				body, err := u.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				opts := metav1.PatchOptions{FieldManager: "migration-test", FieldValidation: metav1.FieldValidationStrict}
				if dryRun {
					opts.DryRun = []string{metav1.DryRunAll}
				}
				if _, err := dyn.Resource(res).Patch(ctx, u.GetName(), types.ApplyPatchType, body, opts); err != nil {
					t.Fatalf("server-side apply (dry run %v) of %s %s: %v", dryRun, u.GetKind(), u.GetName(), err)
				}
				if dryRun {
					continue
				}
				parent.Cleanup(func() { _ = dyn.Resource(res).Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
				stored, err := dyn.Resource(res).Get(ctx, u.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if missing := notIn(u.Object["spec"], stored.Object["spec"], "spec"); missing != "" {
					t.Errorf("%s %s: the API server dropped or changed %s", u.GetKind(), u.GetName(), missing)
				}
			}
		}
	}) && ok
	if !ok {
		t.FailNow()
	}
	t.Run("the printed objects do what MetalLB's configuration did", func(t *testing.T) {
		want := map[string]string{
			"IPPool/l2-pool": `{addresses: [203.0.113.0/26], avoidBuggyIPs: true,
				announce: {mode: L2, l2: {interfaces: [eth1]}, nodeSelector: {matchExpressions: [{key: rack, operator: In, values: [a, b]}]}}}`,
			"IPPool/bgp-pool": `{addresses: [203.0.113.128-203.0.113.191, "2001:db8:1::/120"], autoAssign: false,
				announce: {mode: BGP, nodeSelector: {matchLabels: {bgp: "yes"}}, bgp: {communities: ["64500:100", "65535:65282"], localPref: 150}}}`,
			"IPPool/team-pool": `{addresses: [203.0.113.200/29], priority: 5, serviceAllocation: {namespaces: [team-c]},
				announce: {mode: BGP, bgp: {communities: ["64500:100", "65535:65282"], localPref: 150}}}`,
			"BGPPeer/router": `{address: 198.51.100.1, myASN: 64512, peerASN: 64500, holdTimeSeconds: 90, keepaliveSeconds: 30,
				nodeSelector: {matchLabels: {bgp: "yes"}}, bfd: {enabled: true, minRxMilliseconds: 100, minTxMilliseconds: 100, multiplier: 3},
				passwordSecretRef: {namespace: metalvip-bgp-secrets, name: router-password, key: password}}`,
		}
		for _, u := range objs {
			key := u.GetKind() + "/" + u.GetName()
			var w map[string]any
			if err := yaml.Unmarshal([]byte(want[key]), &w); err != nil || w == nil {
				t.Errorf("%s: printed, not expected (%v)", key, err)
				continue
			}
			if d := notIn(w, u.Object["spec"], "spec"); d != "" {
				t.Errorf("%s: %s is not as MetalLB's configuration says; printed spec %v", key, d, u.Object["spec"])
			}
		}
		// What cannot be mapped exactly is said where it is: the password Secret to copy and
		// the BFD echo mode, each flagged for a check.
		for _, s := range []string{
			"# CHECK: the CCM reads passwords only in metalvip-bgp-secrets",
			"kubectl -n metalvip-bgp-secrets create secret generic router-password",
			"# CHECK: the profile's echo mode is not kept",
			`# 65535:65282 is MetalLB's community alias "no-advertise"`,
			`"203.0.113.128 - 203.0.113.191" written as 203.0.113.128-203.0.113.191`,
		} {
			if !strings.Contains(printed, s) {
				t.Errorf("the output lacks %q", s)
			}
		}
	})

	svcs := metalLBServices()
	for _, s := range svcs {
		createAsMetalLBLeftIt(t, srv, s)
	}
	ok = t.Run("Services keep the addresses MetalLB gave them when metalvip's CCM takes over", func(t *testing.T) {
		before := map[string]string{}
		list, err := srv.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			if len(s.Status.LoadBalancer.Ingress) > 0 {
				before[s.Namespace+"/"+s.Name] = ips(&s)
			}
		}
		if len(before) != len(svcs) {
			t.Fatalf("%d Services with addresses before the take-over, want %d", len(before), len(svcs))
		}
		w, err := srv.Client.CoreV1().Services("").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		changes := make(chan string, 1000)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ev := range w.ResultChan() {
				s, ok := ev.Object.(*corev1.Service)
				if !ok {
					continue
				}
				key := s.Namespace + "/" + s.Name
				if was, tracked := before[key]; tracked && (ev.Type == watch.Deleted || ips(s) != was) {
					changes <- fmt.Sprintf("%s %s: %q -> %q", ev.Type, key, was, ips(s))
				}
			}
		}()
		defer func() { w.Stop(); <-done }()

		start := time.Now()
		ccm := startCCM(parent, srv, bins.ccm) // it serves the later subtests too
		// Taken over: the CCM has recorded each Service's allocation beside its status, and the
		// framework has written the status from the CCM's answer (which sets ipMode).
		deadline := start.Add(90 * time.Second)
		for {
			pending := takeoverPending(t, srv, svcs)
			if pending == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not taken over after 90s: %s", pending)
			}
			select {
			case <-ccm.Done():
				t.Fatalf("the CCM exited: %v", ccm.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
		took := time.Since(start)
		time.Sleep(2 * time.Second) // one more round of the CCM's loops, for any late change
		w.Stop()
		<-done
		close(changes)
		var changed []string
		for c := range changes {
			changed = append(changed, c)
		}
		t.Logf("%d Services taken over by metalvip's CCM %s after its start; %d address changes", len(svcs), took.Round(time.Millisecond), len(changed))
		if len(changed) != 0 {
			t.Errorf("%d address changes over the take-over, want 0:\n%s", len(changed), strings.Join(changed, "\n"))
		}
	})
	if !ok {
		t.FailNow()
	}

	newService := func(t *testing.T, ns, name string, ann map[string]string) netip.Addr {
		t.Helper()
		s := lbService(ns, name, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
		s.Annotations = ann
		if _, err := srv.Client.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := srv.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && len(got.Status.LoadBalancer.Ingress) > 0 {
				a, err := netip.ParseAddr(got.Status.LoadBalancer.Ingress[0].IP)
				if err != nil {
					t.Fatalf("%s/%s: status address %q: %v", ns, name, got.Status.LoadBalancer.Ingress[0].IP, err)
				}
				return a
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s/%s has no address after 30s: %v", ns, name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	inRange := func(a netip.Addr, first, last string) bool {
		return a.Compare(netip.MustParseAddr(first)) >= 0 && a.Compare(netip.MustParseAddr(last)) <= 0
	}
	held := map[netip.Addr]bool{}
	for _, s := range svcs {
		held[netip.MustParseAddr(s.ip)] = true
	}
	t.Run("a new Service asking by metallb.io/loadBalancerIPs gets exactly that address", func(t *testing.T) {
		if got := newService(t, "apps", "new-requested", map[string]string{string(annotation.MetalLBLoadBalancerIPs): "203.0.113.33"}); got != netip.MustParseAddr("203.0.113.33") {
			t.Errorf("got %s, want 203.0.113.33", got)
		}
	})
	t.Run("a new Service naming a pool by metallb.io/address-pool gets an address of the converted pool of that name", func(t *testing.T) {
		got := newService(t, "apps", "new-in-pool", map[string]string{string(annotation.MetalLBAddressPool): "bgp-pool"})
		if !inRange(got, "203.0.113.128", "203.0.113.191") || held[got] {
			t.Errorf("got %s, want a free address of bgp-pool (203.0.113.128-203.0.113.191)", got)
		}
	})
	t.Run("a new Service with the older metallb.universe.tf spelling gets an address of that pool", func(t *testing.T) {
		got := newService(t, "apps", "new-in-pool-old", map[string]string{string(annotation.MetalLBLegacyAddressPool): "bgp-pool"})
		if !inRange(got, "203.0.113.128", "203.0.113.191") || held[got] {
			t.Errorf("got %s, want a free address of bgp-pool", got)
		}
	})
	t.Run("a new Service asking for nothing gets an address where MetalLB would have given one", func(t *testing.T) {
		// bgp-pool does not auto-assign and team-pool serves team-c only: l2-pool, lowest free,
		// and never .0 (avoidBuggyIPs).
		if got := newService(t, "apps", "new-auto", nil); got != netip.MustParseAddr("203.0.113.1") {
			t.Errorf("got %s, want 203.0.113.1, l2-pool's lowest free address", got)
		}
		// In team-c, team-pool comes first (it has a priority).
		if got := newService(t, "team-c", "new-auto", nil); !inRange(got, "203.0.113.200", "203.0.113.207") || held[got] {
			t.Errorf("team-c got %s, want a free address of team-pool (203.0.113.200/29)", got)
		}
	})
	t.Run("metalvip's own pool annotation wins over MetalLB's", func(t *testing.T) {
		got := newService(t, "apps", "both", map[string]string{string(annotation.Pool): "l2-pool", string(annotation.MetalLBAddressPool): "bgp-pool"})
		if !inRange(got, "203.0.113.1", "203.0.113.62") {
			t.Errorf("got %s, want an address of l2-pool", got)
		}
	})
}

// notIn returns the first path where want is not contained in got ("" when it is): maps are
// compared key by key, everything else by value.
func notIn(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path
		}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range w {
				if !yield(k) {
					return
				}
			}
		}) {
			if d := notIn(w[k], g[k], path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s (%v, want %v)", path, got, want)
		}
		for i := range w {
			if d := notIn(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s (%v, want %v)", path, got, want)
		}
		return ""
	}
}

// metalLBService is a Service as MetalLB left it: its annotations, the address MetalLB gave
// it and the pool MetalLB recorded.
type metalLBService struct {
	ns, name string
	ann      map[string]string
	ip, pool string
	ports    []corev1.ServicePort
}

func metalLBServices() []metalLBService {
	http := []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	out := []metalLBService{
		// Addresses MetalLB gave in its own order, not the lowest: a CCM that reassigned
		// would move them.
		{ns: "apps", name: "web", ip: "203.0.113.17", pool: "l2-pool"},
		{ns: "apps", name: "api", ip: "203.0.113.5", pool: "l2-pool"},
		{ns: "apps", name: "db", ann: map[string]string{"metallb.io/address-pool": "bgp-pool"}, ip: "203.0.113.140", pool: "bgp-pool"},
		{ns: "apps", name: "legacy", ann: map[string]string{"metallb.universe.tf/address-pool": "bgp-pool"}, ip: "203.0.113.131", pool: "bgp-pool"},
		{ns: "apps", name: "pinned", ann: map[string]string{"metallb.io/loadBalancerIPs": "203.0.113.30"}, ip: "203.0.113.30", pool: "l2-pool"},
		{ns: "apps", name: "pinned-old", ann: map[string]string{"metallb.universe.tf/loadBalancerIPs": "203.0.113.150"}, ip: "203.0.113.150", pool: "bgp-pool"},
		// Shared addresses: a key that is a label value, and one that is not.
		{ns: "apps", name: "dns-tcp", ann: map[string]string{"metallb.io/allow-shared-ip": "dns"}, ip: "203.0.113.40", pool: "l2-pool",
			ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP}}},
		{ns: "apps", name: "dns-udp", ann: map[string]string{"metallb.io/allow-shared-ip": "dns"}, ip: "203.0.113.40", pool: "l2-pool",
			ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}},
		{ns: "apps", name: "shared-http", ann: map[string]string{"metallb.universe.tf/allow-shared-ip": "web & api"}, ip: "203.0.113.41", pool: "l2-pool"},
		{ns: "apps", name: "shared-https", ann: map[string]string{"metallb.universe.tf/allow-shared-ip": "web & api"}, ip: "203.0.113.41", pool: "l2-pool",
			ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}},
		{ns: "team-c", name: "app", ip: "203.0.113.203", pool: "team-pool"},
		// team-pool was full once: MetalLB fell back on l2-pool.
		{ns: "team-c", name: "overflow", ip: "203.0.113.20", pool: "l2-pool"},
	}
	for i := range 19 {
		out = append(out, metalLBService{ns: "apps", name: fmt.Sprintf("bulk-%02d", i), ip: fmt.Sprintf("203.0.113.%d", 44+i), pool: "l2-pool"})
	}
	for i := range out {
		if out[i].ports == nil {
			out[i].ports = http
		}
		if out[i].ann == nil {
			out[i].ann = map[string]string{}
		}
		out[i].ann["metallb.io/ip-allocated-from-pool"] = out[i].pool
	}
	return out
}

func lbService(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name},
			Ports:    ports,
		},
	}
}

// createAsMetalLBLeftIt creates the Service and writes the status MetalLB wrote.
func createAsMetalLBLeftIt(t *testing.T, srv *kubeapi.Server, m metalLBService) {
	t.Helper()
	ctx := context.Background()
	s := lbService(m.ns, m.name, m.ports...)
	s.Annotations = m.ann
	created, err := srv.Client.CoreV1().Services(m.ns).Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s/%s: %v", m.ns, m.name, err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: m.ip}}
	if _, err := srv.Client.CoreV1().Services(m.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status of %s/%s: %v", m.ns, m.name, err)
	}
}

func ips(s *corev1.Service) string {
	var out []string
	for _, ing := range s.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// takeoverPending names a Service metalvip has not taken over yet, or is "".
func takeoverPending(t *testing.T, srv *kubeapi.Server, svcs []metalLBService) string {
	t.Helper()
	for _, m := range svcs {
		s, err := srv.Client.CoreV1().Services(m.ns).Get(context.Background(), m.name, metav1.GetOptions{})
		if err != nil {
			return fmt.Sprintf("%s/%s: %v", m.ns, m.name, err)
		}
		pool := s.Annotations[string(annotation.AllocatedPool)]
		recorded := s.Annotations[string(annotation.AllocatedIPs)]
		ing := s.Status.LoadBalancer.Ingress
		if pool != m.pool || recorded != ips(s) || len(ing) == 0 || ing[0].IPMode == nil {
			return fmt.Sprintf("%s/%s records pool %q and addresses %q, status %+v", m.ns, m.name, pool, recorded, ing)
		}
	}
	return ""
}

func startCCM(t *testing.T, srv *kubeapi.Server, bin string) *testenv.Proc {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(cfg, []byte(fastConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return testenv.StartProc(t, "ccm", exec.Command(bin,
		"--kubeconfig", srv.Kubeconfig(t, nil),
		"--cloud-config", cfg,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	))
}
