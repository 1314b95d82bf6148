// Package conformance runs Kubernetes' own LoadBalancer e2e specs (k8s.io/kubernetes
// test/e2e/network, `[Feature:LoadBalancer]`, the release the cluster's components come from)
// against metalvip installed from install.yaml on real kubelets (test/kubecluster), once with an
// L2 pool and once with a BGP pool: suites nobody here wrote. Every spec must pass but those in
// skipped, each with its reason (docs/conformance.md has the table).
//
// Both modes run at once on one cluster, each Service drawing from its mode's pool by its
// namespace's e2e-run label: the L2 specs from the lab's client on the segment (192.0.2.100), the
// BGP specs from its remote host behind the router (192.0.2.130). Both addresses are outside the
// nodes' /16: the ExternalTrafficPolicy Local spec takes a client in it for a masqueraded one.
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/kubecluster"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

func TestMain(m *testing.M) {
	testenv.LabLock("test/conformance")
	os.Exit(m.Run())
}

// focus selects the specs: every LoadBalancer spec of sig-network.
const focus = `\[Feature:LoadBalancer\]`

// skipped are the specs that cannot pass on any load balancer that, like metalvip, MetalLB or
// kube-vip, hands the VIP's packets to the nodes' kube-proxy: each with its reason.
var skipped = map[string]string{
	"should be able to switch session affinity for LoadBalancer service with Local traffic policy": "" +
		"needs a load balancer that keeps client affinity itself across nodes: with " +
		"externalTrafficPolicy Local, each node's kube-proxy keeps its own affinity table, and " +
		"the spec expects one backend for every request after switching affinity on (MetalLB and " +
		"kube-vip fail it the same way; docs/services.md)",
}

// specs is how many LoadBalancer specs Kubernetes v1.37.2 has.
const specs = 17

// A mode is one run of the specs: its pool, drawn from by the namespaces the run creates (their
// e2e-run label, e2elb.test --run-id), and where the specs run from.
type mode struct {
	name string
	// runner is the address the specs run from, outside the nodes' /16: on the lab's client
	// (on the segment, L2's clients) or its remote host (behind the router, BGP's).
	runner string
	host   func(*kubecluster.Cluster) *lab.Host
	pool   string
}

var modes = []mode{
	{name: "l2", runner: "192.0.2.100", host: func(c *kubecluster.Cluster) *lab.Host { return c.Lab.Client },
		pool: `apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: conformance-l2}
spec:
  addresses: ["203.0.113.0/26"]
  serviceAllocation: {namespaceSelector: {matchLabels: {e2e-run: conformance-l2}}}
`},
	{name: "bgp", runner: "192.0.2.130", host: func(c *kubecluster.Cluster) *lab.Host { return c.Lab.Remote },
		pool: `apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: conformance-bgp}
spec:
  addresses: ["203.0.113.64/26"]
  announce: {mode: BGP}
  serviceAllocation: {namespaceSelector: {matchLabels: {e2e-run: conformance-bgp}}}
---
apiVersion: metalvip.io/v1alpha1
kind: BGPPeer
metadata: {name: router}
spec: {address: 198.51.100.1, peerASN: 64496, myASN: 64497, gracefulRestart: true,
  bfd: {enabled: true, minRxMilliseconds: 1000, minTxMilliseconds: 1000, multiplier: 3}}
`},
}

// parts split a mode's specs over e2e.test processes that run at once: each rolling-update spec
// takes about 16 minutes (five updates of a DaemonSet whose pods take 60 s to stop, node by
// node), the rest about as long in one process.
var parts = []struct{ name, focus, skip string }{
	{"rolling-local", `rolling update with externalTrafficPolicy=Local`, ""},
	{"rolling-cluster", `rolling update with externalTrafficPolicy=Cluster`, ""},
	{"rest", focus, `rolling update`},
}

func TestKubernetesLoadBalancerSpecs(t *testing.T) {
	testenv.RequireRoot(t)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e2e := filepath.Join(root, ".cache/bin/e2elb.test")
	kubectl := filepath.Join(root, ".cache/bin/kubectl")
	agnhost := filepath.Join(root, ".cache/images/agnhost.tar")
	for _, f := range []string{e2e, kubectl, agnhost} {
		if _, err := os.Stat(f); err != nil {
			testenv.Skip(t, "%s missing: run hack/conformance.sh and hack/kube.sh (make test-deps does)", f)
		}
	}
	images, err := kubecluster.Images()
	if err != nil {
		t.Fatal(err)
	}
	c := kubecluster.New(t, kubecluster.Options{Images: append(images, agnhost), DNS: true})
	// The machine is shared with other packages' tests: the tolerant heartbeat profile, as the
	// real-kubelet e2e uses (no spec here measures failover).
	c.Failover = &kubecluster.FailoverProfile{Interval: "100ms", Misses: 15}
	ctx := context.Background()
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		t.Fatal(err)
	}
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitInitialised(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAgents(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.LogFailure(context.Background(), t)
		}
	})
	for _, m := range modes {
		if err := runnerAddress(ctx, c, m); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(c.Dir, "pool-"+m.name+".yaml")
		if err := os.WriteFile(f, []byte(m.pool), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, "apply", "-f", f); err != nil {
			t.Fatal(err)
		}
	}
	// The router spreads flows over a VIP's nodes by addresses alone (the lab's default hashes
	// ports too): sessionAffinity ClientIP with externalTrafficPolicy Local holds only when a
	// client's connections reach one node (docs/services.md#session-affinity says so).
	if _, err := c.Lab.Router.Run(ctx, "sysctl", "-q", "-w", "net.ipv4.fib_multipath_hash_policy=0"); err != nil {
		t.Fatal(err)
	}
	// Both modes at once, each in three processes: the specs mostly wait (for pods to stop, for
	// timeouts), and one after the other they would take over an hour.
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			run(t, c, m, e2e, kubectl)
		})
	}
}

// runnerAddress gives the mode's host the runner address, as the source of its routes to the
// VIPs, and the router a route back to it.
func runnerAddress(ctx context.Context, c *kubecluster.Cluster, m mode) error {
	h := m.host(c)
	steps := [][]string{{"ip", "addr", "add", m.runner + "/32", "dev", "eth0"}}
	if h == c.Lab.Client {
		// On the segment: the VIPs on-link, answered by ARP, from the runner address.
		steps = append(steps, []string{"ip", "route", "replace", lab.VIPRangeV4.String(), "dev", "eth0", "src", m.runner})
	} else {
		steps = append(steps, []string{"ip", "route", "replace", "default", "via", "198.51.100.129", "src", m.runner})
	}
	for _, s := range steps {
		if _, err := h.Run(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	_, err := c.Lab.Router.Run(ctx, "ip", "route", "replace", m.runner+"/32", "via", h.IPv4.String())
	return err
}

// specReport is what the run reads of Ginkgo's JSON report.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct{ Message string }
}

func (s specReport) name() string {
	return strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
}

// run runs the mode's specs, its parts at once, and checks their reports: every spec passed but
// the skipped ones.
func run(t *testing.T, c *kubecluster.Cluster, m mode, e2e, kubectl string) {
	only := focus
	if extra := os.Getenv("METALVIP_CONFORMANCE_FOCUS"); extra != "" { // for diagnosis: a subset
		only = extra
	}
	var skip []string
	for name := range skipped {
		skip = append(skip, regexp.QuoteMeta(name))
	}
	type result struct {
		reports []specReport
		log     string
		err     error
	}
	results := make([]result, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		partFocus := p.focus
		if p.focus == focus {
			partFocus = only
		} else if only != focus {
			continue // a diagnosis run: the subset only
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			dir := filepath.Join(c.Dir, "conformance-"+m.name+"-"+p.name)
			r.log = filepath.Join(dir, "e2e.log")
			r.reports, r.err = runPart(c, m, e2e, kubectl, dir, partFocus, strings.Join(append(slices.Clone(skip), nonEmpty(p.skip)...), "|"))
		}()
	}
	wg.Wait()
	var table strings.Builder
	counts := map[string]int{}
	failed := false
	selected := regexp.MustCompile(only)
	seen := map[string]bool{} // each part reports the skipped specs too
	for i, r := range results {
		if r.err != nil {
			t.Errorf("%s: %v\n%s", parts[i].name, r.err, tail(r.log, 200))
			failed = true
			continue
		}
		for _, s := range r.reports {
			// Suite nodes have no text; specs outside the focus are reported as skipped too.
			if s.LeafNodeText == "" || !selected.MatchString(s.name()) || (s.State == "skipped" && skipReason(s) == "") || seen[s.name()] {
				continue
			}
			seen[s.name()] = true
			counts[s.State]++
			fmt.Fprintf(&table, "  %-7s %6s  %s\n", s.State, s.RunTime.Round(time.Second), s.name())
			if s.State != "passed" && (s.State != "skipped" || skipReason(s) == "") {
				failed = true
				t.Errorf("%s: %s\n%s\n(its part's log: %s)", s.State, s.name(), s.Failure.Message, r.log)
			}
		}
	}
	t.Logf("Kubernetes LoadBalancer specs, %s from %s: %v\n%s", m.name, m.runner, counts, table.String())
	if counts["passed"] == 0 {
		t.Errorf("no spec passed")
	}
	if n := counts["passed"] + counts["skipped"] + counts["failed"] + counts["panicked"] + counts["timedout"]; only == focus && n != specs {
		t.Errorf("%d LoadBalancer specs ran or were skipped, want the release's %d", n, specs)
	}
	if failed {
		for i, r := range results {
			t.Logf("%s: e2e.test's log (last lines):\n%s", parts[i].name, tail(r.log, 150))
		}
	}
}

// runPart runs e2e.test on the mode's runner with a focus and a skip, and returns its report.
func runPart(c *kubecluster.Cluster, m mode, e2e, kubectl, dir, focus, skip string) ([]specReport, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	report := filepath.Join(dir, "report.json")
	out, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	args := []string{"--provider=skeleton", "--kubeconfig=" + c.Kubeconfig, "--kubectl-path=" + kubectl,
		"--run-id=conformance-" + m.name, fmt.Sprintf("--num-nodes=%d", len(c.Nodes)), "--report-dir=" + dir, "--ginkgo.focus=" + focus,
		"--ginkgo.json-report=" + report, "--ginkgo.timeout=45m", "--ginkgo.v", "--ginkgo.no-color"}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	cmd := m.host(c).Command(ctx, e2e, args...)
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	runErr := cmd.Run()
	fmt.Fprintf(out, "\n(metalvip) e2e.test ran %s: %v\n", time.Since(start).Round(time.Second), runErr)
	data, err := os.ReadFile(report)
	if err != nil {
		return nil, fmt.Errorf("no report (e2e.test: %v): %w", runErr, err)
	}
	var reports []struct{ SpecReports []specReport }
	if err := json.Unmarshal(data, &reports); err != nil || len(reports) != 1 {
		return nil, fmt.Errorf("report %s: %v (%d suites)", report, err, len(reports))
	}
	return reports[0].SpecReports, nil
}

// skipReason is why a spec is in skipped, "" when it is not. Its text there leaves out the tags
// ([LinuxOnly], [Slow]) that end the spec's leaf text.
func skipReason(s specReport) string {
	for name, reason := range skipped {
		if strings.HasPrefix(s.LeafNodeText, name) {
			return reason
		}
	}
	return ""
}

// nonEmpty is s as a list, none when empty.
func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// tail is the last n lines of a file.
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
