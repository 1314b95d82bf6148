package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// Images returns the tarballs a metalvip cluster imports into its nodes: metalvip's own for
// this machine's platform (`make images`) and the harness's pause and HTTP server
// (`make cluster-images`).
func Images() ([]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	plat := runtime.GOOS + "-" + runtime.GOARCH
	return []string{
		filepath.Join(root, "_output/images/cluster/pause.tar"),
		filepath.Join(root, "_output/images/cluster/httpd.tar"),
		filepath.Join(root, "_output/images", plat, "metalvip-cloud-controller-manager.tar"),
		filepath.Join(root, "_output/images", plat, "metalvip-agent.tar"),
	}, nil
}

// Previous is the version the upgrade steps roll back to and upgrade from (hack/previous.sh:
// until a first release, the commit pinned in hack/previous.commit): its images, tagged
// :previous, its install.yaml naming them, its chart.
type Previous struct {
	Commit      string
	Images      []string
	InstallYAML string
	ChartDir    string
}

// PreviousVersion returns what hack/previous.sh built (make test-deps runs it).
func PreviousVersion() (Previous, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return Previous{}, err
	}
	dir := filepath.Join(root, "_output/previous")
	commit, err := os.ReadFile(filepath.Join(dir, "commit"))
	if err != nil {
		return Previous{}, fmt.Errorf("the previous version is not built (run hack/previous.sh; make test-deps does): %w", err)
	}
	plat := runtime.GOOS + "-" + runtime.GOARCH
	p := Previous{
		Commit:      strings.TrimSpace(string(commit)),
		InstallYAML: filepath.Join(dir, "install.yaml"),
		ChartDir:    filepath.Join(dir, "src/charts/metalvip"),
		Images: []string{
			filepath.Join(dir, "images", plat, "metalvip-cloud-controller-manager.tar"),
			filepath.Join(dir, "images", plat, "metalvip-agent.tar"),
		},
	}
	for _, f := range append([]string{p.InstallYAML, p.ChartDir}, p.Images...) {
		if _, err := os.Stat(f); err != nil {
			return Previous{}, fmt.Errorf("the previous version is not built (run hack/previous.sh): %w", err)
		}
	}
	return p, nil
}

// ControlPlaneLabel marks the nodes the CCM Deployment may run on (kubeadm's label).
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// Installer installs metalvip on a cluster and removes it: one function each, so a test can
// switch how (manifests, chart, or a later enrollment scheme) without touching the checks.
type Installer struct {
	Name      string
	Install   func(ctx context.Context, c *Cluster) error
	Uninstall func(ctx context.Context, c *Cluster) error
	// Downgrade replaces the installed version with p the way a user rolls back, and Upgrade
	// brings this tree's back the way a user upgrades; both wait for the rollouts' end.
	Downgrade func(ctx context.Context, c *Cluster, p Previous) error
	Upgrade   func(ctx context.Context, c *Cluster) error
}

// waitRollouts waits until the CCM's Deployment and the agents' DaemonSet have rolled out.
func (c *Cluster) waitRollouts(ctx context.Context) error {
	for _, obj := range []string{"deployment/" + CCMDeployment, "daemonset/" + AgentDaemonSet} {
		if _, err := c.Kubectl(ctx, "-n", MetalvipNamespace, "rollout", "status", obj, "--timeout", "5m"); err != nil {
			return err
		}
	}
	return nil
}

// FailoverProfile is a heartbeat profile (cloud-config failover.interval and misses).
type FailoverProfile struct {
	Interval string // e.g. "100ms"
	Misses   int
}

// shippedFailover is the profile install.yaml's cloud-config carries.
const shippedFailover = "failover:\n      interval: 50ms\n      misses: 3\n"

// installYAML returns file, or a copy with c.Failover's profile in its cloud-config.
func (c *Cluster) installYAML(file string) (string, error) {
	if c.Failover == nil && c.CloudConfig == "" {
		return file, nil
	}
	if !filepath.IsAbs(file) { // the repository's, as kubectl in the control namespace reads it
		root, err := testenv.RepoRoot()
		if err != nil {
			return "", err
		}
		file = filepath.Join(root, file)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	if strings.Count(string(data), shippedFailover) != 1 {
		return "", fmt.Errorf("%s: no cloud-config failover section with the shipped profile to replace", file)
	}
	profile := shippedFailover
	if c.Failover != nil {
		profile = fmt.Sprintf("failover:\n      interval: %s\n      misses: %d\n", c.Failover.Interval, c.Failover.Misses)
	}
	if c.CloudConfig != "" {
		// The extra sections go before failover's (whose indentation stays in the file).
		profile = strings.TrimPrefix(c.CloudConfig, "    ") + "    " + profile
	}
	data = []byte(strings.Replace(string(data), shippedFailover, profile, 1))
	out := filepath.Join(c.Dir, "install-"+strings.ReplaceAll(filepath.Base(filepath.Dir(file))+"-"+filepath.Base(file), "/", "-"))
	return out, os.WriteFile(out, data, 0o600)
}

// applyAndRoll is `kubectl apply --server-side -f file` (with c.Failover's profile) and the wait
// for the rollouts.
func (c *Cluster) applyAndRoll(ctx context.Context, file string) error {
	f, err := c.installYAML(file)
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "-f", f); err != nil {
		return err
	}
	return c.waitRollouts(ctx)
}

// chartSettings are the values the chart is installed, upgraded and rolled back with.
func (c *Cluster) chartSettings() []string {
	s := []string{"--set", "ccm.serviceMonitor.enabled=true", "--set", "agent.podMonitor.enabled=true"}
	if c.Failover != nil {
		s = append(s, "--set", "cloudConfig.failover.interval="+c.Failover.Interval, "--set", fmt.Sprintf("cloudConfig.failover.misses=%d", c.Failover.Misses))
	}
	return s
}

// helmUpgrade is `helm upgrade` of the release to chart with the settings (and more) and the
// wait for the rollouts.
func (c *Cluster) helmUpgrade(ctx context.Context, chart string, more ...string) error {
	args := append([]string{"upgrade", "metalvip", chart, "--namespace", "kube-system", "--wait", "--timeout", "5m"}, c.chartSettings()...)
	if _, err := c.Tool(ctx, "helm", append(args, more...)...); err != nil {
		return err
	}
	return c.waitRollouts(ctx)
}

// Manifests installs as docs/install-kubeadm.md says: certificates by metalvipctl as Secrets,
// then `kubectl apply --server-side -f manifests/install.yaml`.
var Manifests = Installer{
	Name: "install.yaml",
	Install: func(ctx context.Context, c *Cluster) error {
		if err := c.ApplyCerts(ctx); err != nil {
			return err
		}
		f, err := c.installYAML("manifests/install.yaml")
		if err != nil {
			return err
		}
		_, err = c.Kubectl(ctx, "apply", "--server-side", "-f", f)
		return err
	},
	Uninstall: func(ctx context.Context, c *Cluster) error {
		_, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait", "--timeout", "2m", "-f", "manifests/install.yaml")
		return errors.Join(err, c.removeCerts(ctx))
	},
	Downgrade: func(ctx context.Context, c *Cluster, p Previous) error { return c.applyAndRoll(ctx, p.InstallYAML) },
	Upgrade:   func(ctx context.Context, c *Cluster) error { return c.applyAndRoll(ctx, "manifests/install.yaml") },
}

// Chart installs as docs/install-helm.md says: the same Secrets, then `helm install` of
// charts/metalvip with the default values and monitoring on (prometheus-operator's CRDs
// first, generated from its Go API module: the ServiceMonitor, the PodMonitor and the metrics
// reader's token Secret).
var Chart = Installer{
	Name: "chart",
	Install: func(ctx context.Context, c *Cluster) error {
		if err := c.ApplyCerts(ctx); err != nil {
			return err
		}
		crds, err := kubeapi.MonitoringCRDs()
		if err != nil {
			return err
		}
		if _, err := c.Kubectl(ctx, "apply", "--server-side", "-f", crds); err != nil {
			return err
		}
		if _, err := c.Kubectl(ctx, "wait", "--for", "condition=Established", "--timeout", "60s",
			"crd/servicemonitors.monitoring.coreos.com", "crd/podmonitors.monitoring.coreos.com"); err != nil {
			return err
		}
		_, err = c.Tool(ctx, "helm", append([]string{"install", "metalvip", "charts/metalvip", "--namespace", "kube-system", "--wait", "--timeout", "3m"}, c.chartSettings()...)...)
		return err
	},
	// A rollback to a version the release never had (helm rollback goes to an earlier
	// revision): `helm upgrade` to the previous version's chart with its images.
	Downgrade: func(ctx context.Context, c *Cluster, p Previous) error {
		return c.helmUpgrade(ctx, p.ChartDir, "--set", "image.tag=previous")
	},
	Upgrade: func(ctx context.Context, c *Cluster) error { return c.helmUpgrade(ctx, "charts/metalvip") },
	Uninstall: func(ctx context.Context, c *Cluster) error {
		_, err := c.Tool(ctx, "helm", "uninstall", "metalvip", "--namespace", "kube-system", "--wait", "--timeout", "2m")
		// Helm keeps CRDs: remove them too, so that the next install starts from nothing.
		_, cerr := c.Kubectl(ctx, "delete", "--ignore-not-found", "-f", "charts/metalvip/crds/")
		var merr error
		if crds, err := kubeapi.MonitoringCRDs(); err == nil {
			_, merr = c.Kubectl(ctx, "delete", "--ignore-not-found", "-f", crds)
		}
		return errors.Join(err, cerr, merr, c.removeCerts(ctx))
	},
}

// ApplyCerts runs `metalvipctl certs --manifests` for the cluster's nodes and applies the
// Secrets it prints.
func (c *Cluster) ApplyCerts(ctx context.Context) error {
	ctl, err := c.metalvipctl()
	if err != nil {
		return err
	}
	var names []string
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	pki := filepath.Join(c.Dir, "pki")
	_ = os.RemoveAll(pki)
	out, err := exec.CommandContext(ctx, ctl, "certs", "--nodes", strings.Join(names, ","), "--out", pki, "--manifests").Output()
	if err != nil {
		return fmt.Errorf("metalvipctl certs: %w", err)
	}
	f := filepath.Join(c.Dir, "metalvip-tls.yaml")
	if err := os.WriteFile(f, out, 0o600); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "apply", "-f", f)
	return err
}

func (c *Cluster) removeCerts(ctx context.Context) error {
	_, err := c.Kubectl(ctx, "-n", "kube-system", "delete", "--ignore-not-found", "secret", "metalvip-ccm-tls", "metalvip-agent-tls", "metalvip-viewer-tls")
	return err
}

// Metalvipctl runs metalvipctl with the cluster's kubeconfig in the control namespace, as an
// operator on the cluster's network would, and returns its standard output (and its standard
// error in the error).
func (c *Cluster) Metalvipctl(ctx context.Context, args ...string) (string, error) {
	ctl, err := c.metalvipctl()
	if err != nil {
		return "", err
	}
	cmd := c.Lab.Control.Command(ctx, ctl, append(args, "--kubeconfig", c.Kubeconfig)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("metalvipctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func (c *Cluster) metalvipctl() (string, error) {
	p := filepath.Join(c.Dir, "bin", "metalvipctl")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return testenv.GoBuild(filepath.Dir(p), "./cmd/metalvipctl")
}

// ClearAgentState empties every node's /var/lib/metalvip-agent (the DaemonSet's hostPath), so
// that an install after an uninstall starts from nothing, as on new machines.
func (c *Cluster) ClearAgentState() error {
	var errs []error
	for _, n := range c.Nodes {
		entries, _ := os.ReadDir(n.StateDir)
		for _, e := range entries {
			errs = append(errs, os.RemoveAll(filepath.Join(n.StateDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Label sets (value non-nil) or removes a label on a node.
func (c *Cluster) Label(ctx context.Context, node, key string, value *string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, key)
	if value != nil {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, *value)
	}
	_, err := c.Client.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
	return err
}

// MACs maps each node's eth0 MAC to the node's name.
func (c *Cluster) MACs() (map[string]string, error) {
	out := map[string]string{}
	for _, n := range c.Nodes {
		err := n.Host.Do(func() error {
			ifi, err := net.InterfaceByName("eth0")
			if err == nil {
				out[ifi.HardwareAddr.String()] = n.Name
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Owner returns the node whose agent answers ARP for vip at the on-link client, or "".
func (c *Cluster) Owner(vip netip.Addr) (string, error) {
	macs, err := c.MACs()
	if err != nil {
		return "", err
	}
	got, err := c.Lab.Client.AskNeighbor(vip, 300*time.Millisecond, true)
	if err != nil || len(got) == 0 {
		return "", err
	}
	return macs[got[0]], nil
}

// NextHops returns the node names the router's kernel routes vip to, sorted.
func (c *Cluster) NextHops(vip netip.Addr) ([]string, error) {
	out, err := c.Lab.Router.Run(context.Background(), "ip", "route", "show", vip.String())
	if err != nil {
		return nil, err
	}
	byIP := map[string]string{}
	for _, n := range c.Nodes {
		byIP[n.Host.IPv4.String()] = n.Name
	}
	var hops []string
	for _, f := range strings.Fields(string(out)) {
		if name, ok := byIP[f]; ok {
			hops = append(hops, name)
		}
	}
	slices.Sort(hops)
	return slices.Compact(hops), nil
}

// WaitFor polls cond every 100 ms until it holds or timeout passes; it returns how long it
// took, or the last reason cond gave.
func WaitFor(timeout time.Duration, cond func() (bool, string)) (time.Duration, error) {
	return WaitForEvery(100*time.Millisecond, timeout, cond)
}

// WaitForEvery is WaitFor asking cond every interval.
func WaitForEvery(interval, timeout time.Duration, cond func() (bool, string)) (time.Duration, error) {
	start := time.Now()
	for {
		ok, why := cond()
		if ok {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("not within %s: %s", timeout, why)
		}
		time.Sleep(interval)
	}
}

// DaemonSetReady reports whether a DaemonSet has an available, up-to-date pod on every node
// it wants.
func DaemonSetReady(ds *appsv1.DaemonSet) (bool, string) {
	s := ds.Status
	why := fmt.Sprintf("%s: desired %d, ready %d, available %d, updated %d", ds.Name, s.DesiredNumberScheduled, s.NumberReady, s.NumberAvailable, s.UpdatedNumberScheduled)
	return s.DesiredNumberScheduled > 0 && s.NumberAvailable == s.DesiredNumberScheduled && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.ObservedGeneration >= ds.Generation, why
}

// PodsOn returns the running pods matching selector in ns by node, ready ones only with ready.
func (c *Cluster) PodsOn(ctx context.Context, ns, selector string, ready bool) (map[string][]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	out := map[string][]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		if ready && !PodReady(&p) {
			continue
		}
		out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p)
	}
	return out, nil
}

// LogFailure logs what a failed test's reader needs: the cluster's state, the last lines of the
// CCM's and the agents' pods and every node's daemons' logs.
func (c *Cluster) LogFailure(ctx context.Context, t testenv.TB) {
	t.Logf("cluster at the failure:\n%s", c.Describe(ctx))
	t.Logf("CCM pods:\n%s", c.PodLogs(ctx, MetalvipNamespace, CCMSelector, 80))
	t.Logf("agent pods:\n%s", c.PodLogs(ctx, MetalvipNamespace, AgentSelector, 60))
	c.DumpNodes(t)
}

// PodReady reports a pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodLogs returns the logs (last lines) of every container of the pods matching selector in
// ns, fetched through the API server from the kubelets, for failure reports.
func (c *Cluster) PodLogs(ctx context.Context, ns, selector string, lines int64) string {
	list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("list pods %s: %v", selector, err)
	}
	var b strings.Builder
	for _, p := range list.Items {
		for _, ct := range p.Spec.Containers {
			for _, previous := range []bool{true, false} {
				raw, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name, TailLines: &lines, Previous: previous}).DoRaw(ctx)
				if previous && err != nil {
					continue // no earlier container
				}
				which := "current"
				if previous {
					which = "previous"
				}
				fmt.Fprintf(&b, "--- pod %s/%s on %s, container %s (%s):\n", ns, p.Name, p.Spec.NodeName, ct.Name, which)
				if err != nil {
					fmt.Fprintf(&b, "(logs: %v)\n", err)
					continue
				}
				b.Write(raw)
			}
		}
	}
	return b.String()
}

// WaitInitialised waits until the CCM has initialised every node (provider ID
// metalvip://<node>, the uninitialized taint removed) and returns how long it took.
func (c *Cluster) WaitInitialised(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	return WaitFor(timeout, func() (bool, string) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, n := range nodes.Items {
			if n.Spec.ProviderID != "metalvip://"+n.Name {
				return false, fmt.Sprintf("%s has provider ID %q", n.Name, n.Spec.ProviderID)
			}
			for _, taint := range n.Spec.Taints {
				if taint.Key == "node.cloudprovider.kubernetes.io/uninitialized" {
					return false, n.Name + " keeps the uninitialized taint"
				}
			}
		}
		return len(nodes.Items) == len(c.Nodes), fmt.Sprintf("%d nodes", len(nodes.Items))
	})
}

// WaitAgents waits until the agent DaemonSet is Ready on every node and returns how long it
// took.
func (c *Cluster) WaitAgents(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	return WaitFor(timeout, func() (bool, string) {
		ds, err := c.Client.AppsV1().DaemonSets(MetalvipNamespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if ok, why := DaemonSetReady(ds); !ok {
			return false, why
		}
		return ds.Status.NumberAvailable == int32(len(c.Nodes)), fmt.Sprintf("%d agents available of %d nodes", ds.Status.NumberAvailable, len(c.Nodes))
	})
}

// EventsSince returns the Events in ns with reason that were last seen at or after since, as
// "object: message" lines, oldest first.
func (c *Cluster) EventsSince(ctx context.Context, ns, reason string, since time.Time) []string {
	list, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		return []string{fmt.Sprintf("list events: %v", err)}
	}
	evs := list.Items
	slices.SortFunc(evs, func(a, b corev1.Event) int { return lastSeen(a).Compare(lastSeen(b)) })
	var out []string
	for _, e := range evs {
		// Event times have second precision: a second of slack rather than a missed move.
		if lastSeen(e).Before(since.Add(-time.Second)) {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s/%s: %s", lastSeen(e).Format(time.RFC3339), e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message))
	}
	return out
}

func lastSeen(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil:
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
