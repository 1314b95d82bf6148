// Package kubecluster brings up a real Kubernetes cluster in the lab (test/lab) for end-to-end
// tests and the demo: etcd, kube-apiserver, kube-scheduler and kube-controller-manager in the
// lab's control namespace, and on every lab node containerd, a kubelet started with
// --cloud-provider=external (so a CCM must initialise the node) and kube-proxy, each node in its
// own network and mount namespace, pods on a bridge CNI. It installs nothing of metalvip: the
// tests do that as a user would (images imported, manifests or chart applied).
//
//	nodes      198.51.100.11-13 (lab segment)   API server 198.51.100.2:6443 (control)
//	pods       198.18.<i>.0/24 on node i        Services   198.19.0.0/16
//
// It must not touch the host beyond what kubelet forces on it: machine-wide sysctls are saved
// first and restored at teardown, cgroups live under a parent of their own, and host folders
// the kubelet hard-codes are bind-mounted per node inside private mount namespaces. A reaper
// process undoes everything even when the test binary dies (as test/lab's does for the
// namespaces). The component binaries come from hack/kube.sh
// (.cache/bin), the rest from Debian (hack/install-deps.sh).
package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

// Addresses of the cluster (beside the lab's).
var (
	PodCIDR     = netip.MustParsePrefix("198.18.0.0/16")
	ServiceCIDR = netip.MustParsePrefix("198.19.0.0/16")
	// ClusterRanges holds both: traffic between them is not masqueraded.
	ClusterRanges = netip.MustParsePrefix("198.18.0.0/15")
)

// APIPort is the API server's port on the control host.
const APIPort = 6443

// kubeletSysctls are the machine-wide sysctls a kubelet sets even from a network namespace.
var kubeletSysctls = []string{"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops",
	"vm.panic_on_oom", "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes"}

// hostPaths are folders a kubelet, containerd, the CNI or the agent DaemonSet use at fixed paths
// on the host; each node gets its own, bind-mounted in its mount namespace.
var hostPaths = []string{"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd",
	"/var/lib/cni", "/var/lib/metalvip-agent"}

// cgroupHierarchies are the cgroup v1 hierarchies the kubelet checks (this kernel mounts v1
// controllers, cgroup2 only at unified with none).
var cgroupHierarchies = []string{"cpu", "cpuacct", "cpuset", "memory", "systemd", "pids", "devices", "freezer", "blkio"}

// Binaries are the programs a cluster runs.
type Binaries struct {
	APIServer, ControllerManager, Scheduler, Kubelet, KubeProxy string // .cache/bin
	CoreDNS                                                     string // .cache/bin, optional
	Etcd, Containerd, Ctr, Nsenter, Unshare                     string // Debian
}

// FindBinaries locates every program of a cluster and says how to get the missing ones.
func FindBinaries() (Binaries, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	cache := func(name, script string) (string, error) {
		p := filepath.Join(root, ".cache", "bin", name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s not found at %s; run %s (make test does)", name, p, script)
		}
		return p, nil
	}
	debian := func(name string) (string, error) {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%s not found; run hack/install-deps.sh (make test does)", name)
		}
		return p, nil
	}
	var b Binaries
	var errs []error
	for _, f := range []struct {
		dst          *string
		name, script string
	}{
		{&b.APIServer, "kube-apiserver", "hack/kube.sh"},
		{&b.ControllerManager, "kube-controller-manager", "hack/kube.sh"},
		{&b.Scheduler, "kube-scheduler", "hack/kube.sh"},
		{&b.Kubelet, "kubelet", "hack/kube.sh"},
		{&b.KubeProxy, "kube-proxy", "hack/kube.sh"},
	} {
		p, err := cache(f.name, f.script)
		*f.dst = p
		errs = append(errs, err)
	}
	if p, err := cache("coredns", "hack/conformance.sh"); err == nil {
		b.CoreDNS = p
	}
	for _, f := range []struct {
		dst  *string
		name string
	}{{&b.Etcd, "etcd"}, {&b.Containerd, "containerd"}, {&b.Ctr, "ctr"}, {&b.Nsenter, "nsenter"}, {&b.Unshare, "unshare"}} {
		p, err := debian(f.name)
		*f.dst = p
		errs = append(errs, err)
	}
	for _, name := range []string{"runc", "iptables", "conntrack", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local"} {
		_, err := debian(name)
		errs = append(errs, err)
	}
	return b, errors.Join(errs...)
}

// Options shape a cluster.
type Options struct {
	Nodes int // default 3, at most 9 (one /24 of pods each)
	// Images are tarballs (`docker save` format) imported into every node's containerd before
	// its kubelet starts. The pause image (registry.k8s.io/pause:3.10) must be among them.
	Images []string
	// ProxyMode is kube-proxy's mode: iptables (default) or nftables.
	ProxyMode string
	// DNS runs a cluster DNS: CoreDNS (.cache/bin/coredns, hack/conformance.sh) on the control
	// host, serving cluster.local from the API server, and the kubelets point pods at it.
	DNS bool
}

// Cluster is a running cluster.
type Cluster struct {
	Lab    *lab.Lab
	Config *rest.Config // for the test process: dials through the control namespace
	Client kubernetes.Interface
	// Kubeconfig is a kubeconfig for processes inside the lab (kubectl and helm in the control
	// namespace: Control.Command), with an administrator's token.
	Kubeconfig string
	Dir        string
	Nodes      []*Node
	// Timings of the bring-up, for the benchmarks.
	ControlPlaneReady, NodesReady time.Duration
	// Failover, when set, replaces the shipped heartbeat profile (50 ms x 3) in every install,
	// upgrade and rollback (install.yaml's cloud-config, the chart's values): the e2e suite
	// shares a 2-core machine with other tests, whose stalls of up to a second the shipped
	// profile takes for deaths; the benchmarks leave it unset and measure the shipped one.
	Failover *FailoverProfile
	// CloudConfig, when set, is added to install.yaml's cloud-config (indented as its other
	// sections, e.g. "    egress:\n      clusterCIDRs: [...]\n").
	CloudConfig string

	t      testenv.TB
	opts   Options
	bins   Binaries
	apiCA  string
	token  string
	reaper *testenv.Reaper
	// sysctls are the kubelet's machine-wide sysctls as found (key=value), restored at teardown.
	sysctls []string
}

// Node is one kubelet node.
type Node struct {
	Name    string
	Host    *lab.Host
	Dir     string
	PodCIDR netip.Prefix
	// StateDir is, on the host, the node's /var/lib/metalvip-agent.
	StateDir string

	c          *Cluster
	index      int
	holder     *testenv.Proc
	cgroup     string
	containerd *testenv.Proc
	kubelet    *testenv.Proc
	proxy      *testenv.Proc
	starts     int
}

// New brings up a cluster; it is torn down when t ends. It skips t (fails it under
// METALVIP_REQUIRE_LAB=1) when not root or when binaries are missing.
func New(t testenv.TB, opts Options) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	bins, err := FindBinaries()
	if err != nil {
		testenv.Skip(t, "%v", err)
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 1 || opts.Nodes > 9 {
		t.Fatalf("kubecluster: %d nodes; give 1 to 9", opts.Nodes)
	}
	if opts.ProxyMode == "" {
		opts.ProxyMode = "iptables"
	}
	for _, img := range opts.Images {
		if _, err := os.Stat(img); err != nil {
			testenv.Skip(t, "image %s: %v; run make images cluster-images (make test-deps does)", img, err)
		}
	}
	if opts.DNS && bins.CoreDNS == "" {
		testenv.Skip(t, "coredns not found in .cache/bin; run hack/conformance.sh (make test-deps does)")
	}
	start := time.Now()
	c := &Cluster{t: t, opts: opts, bins: bins}
	if c.Dir, err = os.MkdirTemp("", "metalvip-kubecluster-"); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.Lab = lab.New(t, lab.Options{Nodes: opts.Nodes})
	for i, h := range c.Lab.Nodes {
		n := &Node{Name: h.Name, Host: h, Dir: filepath.Join(c.Dir, h.Name), c: c, index: i + 1,
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i + 1), 0}), 24),
			cgroup:  "mvk-" + c.Lab.ID + "-" + h.Name}
		n.StateDir = filepath.Join(n.Dir, "host", "var/lib/metalvip-agent")
		c.Nodes = append(c.Nodes, n)
	}
	// The reaper first, so that whatever happens next is undone.
	if err := c.startReaper(); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	t.Cleanup(c.close)
	if err := c.startControlPlane(); err != nil {
		t.Fatalf("kubecluster: control plane: %v", err)
	}
	c.ControlPlaneReady = time.Since(start)
	for _, n := range c.Nodes {
		if err := n.prepare(); err != nil {
			t.Fatalf("kubecluster: %s: %v", n.Name, err)
		}
		if err := n.Start(); err != nil {
			t.Fatalf("kubecluster: %s: %v", n.Name, err)
		}
	}
	if err := c.waitNodes(2 * time.Minute); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.NodesReady = time.Since(start)
	t.Logf("kubecluster %s: control plane ready after %s, %d nodes registered and Ready after %s",
		c.Lab.ID, c.ControlPlaneReady.Round(time.Millisecond), len(c.Nodes), c.NodesReady.Round(time.Millisecond))
	return c
}

// startReaper starts a process that waits for its stdin to close (the test binary's end, or
// close) and then kills every container and shim of the cluster, removes its cgroups and
// folders and restores the machine-wide sysctls. Processes in the lab's namespaces (kubelets,
// containerd, hostNetwork pods) are test/lab's reaper's; pods' own namespaces are this one's.
func (c *Cluster) startReaper() error {
	var sysctls []string
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", k, err)
		}
		sysctls = append(sysctls, k+"="+strings.TrimSpace(string(b)))
	}
	c.sysctls = sysctls
	var cgroups, mountpoints []string
	for _, n := range c.Nodes {
		cgroups = append(cgroups, n.cgroup)
	}
	for _, p := range hostPaths {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			mountpoints = append(mountpoints, p) // ours: created below, removed when empty
		}
	}
	script := `kill_ours() {
  for p in /proc/[0-9]*; do
    case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in *"$KC_DIR"*) kill -9 "${p#/proc/}" 2>/dev/null;; esac
  done
  for cg in $KC_CGROUPS; do
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h$cg" ] && find "$h$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
    done
  done
}
kill_ours; sleep 1; kill_ours; sleep 0.5
for cg in $KC_CGROUPS; do
  for h in /sys/fs/cgroup/*/; do [ -d "$h$cg" ] && find "$h$cg" -depth -type d -exec rmdir {} \; 2>/dev/null; done
done
sysctl -q -w $KC_SYSCTLS
rm -rf "$KC_DIR"
for m in $KC_MOUNTPOINTS; do rmdir "$m" 2>/dev/null; done
echo reaped`
	var err error
	c.reaper, err = testenv.StartReaper("kubecluster-reaper", script, []string{"KC_DIR=" + c.Dir, "KC_CGROUPS=" + strings.Join(cgroups, " "),
		"KC_SYSCTLS=" + strings.Join(sysctls, " "), "KC_MOUNTPOINTS=" + strings.Join(mountpoints, " ")})
	return err
}

// close stops the nodes, then lets the reaper remove what is left. test/lab's cleanup, which
// runs after this one, removes the namespaces.
func (c *Cluster) close() {
	for _, n := range c.Nodes {
		n.stopDaemons(false)
	}
	if !c.reaper.Reap(60 * time.Second) {
		c.t.Errorf("kubecluster %s: reaper did not finish within 60s", c.Lab.ID)
		return
	}
	for _, kv := range c.sysctls {
		k, want, _ := strings.Cut(kv, "=")
		b, _ := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		if got := strings.TrimSpace(string(b)); got != want {
			c.t.Errorf("kubecluster %s: sysctl %s is %s after teardown, was %s", c.Lab.ID, k, got, want)
		}
	}
}

// startControlPlane starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager
// in the control namespace and waits until the API server is ready.
func (c *Cluster) startControlPlane() error {
	ctl := c.Lab.Control
	cp := filepath.Join(c.Dir, "control-plane")
	if err := os.MkdirAll(cp, 0o700); err != nil {
		return err
	}
	// etcd's fsyncs dominate API latency on a disk; on tmpfs they cost nothing.
	etcdDir := filepath.Join(cp, "etcd")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "metalvip-kubecluster-etcd-")
		if err != nil {
			return err
		}
		etcdDir = d
		c.t.Cleanup(func() { os.RemoveAll(d) })
	}
	ctl.Start(c.t, "etcd", c.bins.Etcd, "--name", "default", "--data-dir", etcdDir,
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380", "--log-level", "warn")

	if _, err := pki.ServiceAccount(cp); err != nil {
		return err
	}
	token, err := pki.AdminToken(cp, "kubecluster-admin")
	if err != nil {
		return err
	}
	c.token = token
	// A client CA, as every kubeadm cluster has: the API server then publishes it in
	// kube-system/extension-apiserver-authentication, which the CCM's secure port reads
	// (without it the CCM logs the ConfigMap's absence many times a minute).
	if err := pki.ClientCA(cp, 24*time.Hour); err != nil {
		return err
	}
	certDir := filepath.Join(cp, "certs")
	c.apiCA = filepath.Join(certDir, "apiserver.crt")
	addr := ctl.IPv4.String()
	ctl.Start(c.t, "kube-apiserver", c.bins.APIServer, "--etcd-servers", "http://127.0.0.1:2379",
		"--cert-dir", certDir, "--bind-address", "0.0.0.0", "--advertise-address", addr,
		"--secure-port", fmt.Sprint(APIPort),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(cp, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(cp, "sa.key"),
		"--token-auth-file", filepath.Join(cp, "tokens.csv"), "--authorization-mode", "RBAC",
		"--client-ca-file", filepath.Join(cp, "client-ca.crt"),
		// InternalIP: logs and exec would look node names up in DNS.
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-cluster-ip-range", ServiceCIDR.String(), "--allow-privileged", "--v", "1")

	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(c.apiCA); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("kube-apiserver wrote no certificate within 90s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Config = &rest.Config{Host: fmt.Sprintf("https://%s:%d", addr, APIPort), BearerToken: c.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.apiCA}, Dial: ctl.DialContext, QPS: 200, Burst: 400}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, last = c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if last == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready within 90s: %v", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Kubeconfig = filepath.Join(cp, "kubeconfig")
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "https://%s:%d", certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: lab, context: {cluster: lab, user: admin}}]
current-context: lab
`, addr, APIPort, c.apiCA, c.token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		return err
	}
	kc := c.Kubeconfig
	ctl.Start(c.t, "kube-scheduler", c.bins.Scheduler, "--kubeconfig", kc, "--authentication-kubeconfig", kc,
		"--authorization-kubeconfig", kc, "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "10259")
	// --cloud-provider=external: the cloud parts (node initialisation, Services' load
	// balancers) are metalvip's CCM's. No node IPAM: every node's pod range is its CNI's.
	ctl.Start(c.t, "kube-controller-manager", c.bins.ControllerManager, "--kubeconfig", kc,
		"--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "10257", "--controllers", "*,-nodeipam",
		"--cloud-provider=external", "--service-account-private-key-file", filepath.Join(cp, "sa.key"),
		"--root-ca-file", c.apiCA, "--use-service-account-credentials=false", "--cluster-cidr", PodCIDR.String())
	if c.opts.DNS {
		corefile := filepath.Join(cp, "Corefile")
		// No forward plugin: the lab has no upstream resolver; names outside the cluster fail.
		if err := os.WriteFile(corefile, []byte(fmt.Sprintf(`.:53 {
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s lab
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
`, kc)), 0o600); err != nil {
			return err
		}
		ctl.Start(c.t, "coredns", c.bins.CoreDNS, "-conf", corefile)
	}
	return nil
}

// clusterDNS is the kubelets' clusterDNS setting: the control host, when it runs the DNS.
func (c *Cluster) clusterDNS() string {
	if !c.opts.DNS {
		return ""
	}
	return fmt.Sprintf("clusterDNS: [%s]\n", c.Lab.Control.IPv4)
}

// waitNodes waits until every node is registered and Ready.
func (c *Cluster) waitNodes(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ready := map[string]bool{}
		if list, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err == nil {
			for _, n := range list.Items {
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready[n.Name] = true
					}
				}
			}
		}
		missing := []string{}
		for _, n := range c.Nodes {
			if !ready[n.Name] {
				missing = append(missing, n.Name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes %v not Ready within %s", missing, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Reregister makes every node join anew (Node.Reregister) and waits until all are Ready.
func (c *Cluster) Reregister(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := n.Reregister(ctx); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return c.waitNodes(2 * time.Minute)
}

// Kubectl runs the cached kubectl (hack/tool.sh) against the cluster in the control namespace,
// as a user on the cluster's network would, and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.Tool(ctx, "kubectl", args...)
}

// Tool runs kubectl or helm (built once by hack/tool.sh) in the control namespace with the
// cluster's kubeconfig.
func (c *Cluster) Tool(ctx context.Context, tool string, args ...string) (string, error) {
	bin, err := toolPath(tool)
	if err != nil {
		return "", err
	}
	root, _ := testenv.RepoRoot()
	cmd := c.Lab.Control.Command(ctx, bin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "HELM_CACHE_HOME="+filepath.Join(c.Dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.Dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(c.Dir, "helm-data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func toolPath(tool string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(root, "hack", "tool.sh"), tool).Output()
	if err != nil {
		return "", fmt.Errorf("hack/tool.sh %s: %w", tool, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// DumpNodes logs the end of every node's kubelet, containerd and kube-proxy logs.
func (c *Cluster) DumpNodes(t testenv.TB) {
	for _, n := range c.Nodes {
		for _, p := range []*testenv.Proc{n.kubelet, n.containerd, n.proxy} {
			if p != nil {
				t.Logf("--- %s (%s), last lines:\n%s", p.Name, p.Log, p.Tail(30))
			}
		}
	}
}
