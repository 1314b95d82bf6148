package kubecluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/testenv"
)

// prepare gives the node what outlives its daemons: routes to the other nodes' pods, a mount
// namespace (held by a sleeping process) with the node's own host folders, a cgroup parent,
// and the daemons' configuration.
func (n *Node) prepare() error {
	for _, d := range []string{"containerd/root", "containerd/state", "kubelet", "manifests", "podlogs", "cni"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := n.podRoutes(); err != nil {
		return err
	}
	// Pods leave the node with its address, except towards other pods and Services: as Calico,
	// Cilium or Flannel do (the bridge CNI's ipMasq would masquerade everything off the node's own
	// pod range, and a pod on another node would see the node's address, not the pod's).
	if _, err := n.Host.Run(context.Background(), "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", n.PodCIDR.String(),
		"!", "-d", ClusterRanges.String(), "-m", "comment", "--comment", "kubecluster: pods to the outside", "-j", "MASQUERADE"); err != nil {
		return err
	}
	// Forwarding, as kubeadm requires of every node: kube-proxy forwards a Service's traffic to
	// pods on other nodes. The CNI turns it on only on nodes that run a pod on the bridge.
	if _, err := n.Host.Run(context.Background(), "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		return err
	}
	// nsenter --net, not `ip netns exec`: that remounts /sys and hides /sys/fs/cgroup.
	n.holder = testenv.StartProc(n.c.t, n.Name+"-mountns", exec.Command(n.c.bins.Nsenter, "-F", "--net=/run/netns/"+n.Host.NS,
		n.c.bins.Unshare, "-m", "--propagation", "slave", "sleep", "infinity"))
	self, _ := os.Readlink("/proc/self/ns/mnt")
	deadline := time.Now().Add(10 * time.Second)
	for {
		mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Cmd.Process.Pid))
		if err == nil && mnt != self {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mount namespace holder did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range hostPaths {
		src := filepath.Join(n.Dir, "host", p)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if out, err := n.exec("mount", "--bind", src, p); err != nil {
			return fmt.Errorf("bind %s: %v: %s", p, err, out)
		}
	}
	for _, h := range cgroupHierarchies {
		if err := os.MkdirAll(filepath.Join("/sys/fs/cgroup", h, n.cgroup), 0o755); err != nil {
			return err
		}
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/cpuset", n.cgroup, f), b, 0o644); err != nil {
			return err
		}
	}
	return n.writeConfigs()
}

// podRoutes routes the other nodes' pod ranges through their node addresses (link down removes
// them, so Revive calls it again).
func (n *Node) podRoutes() error {
	ctx := context.Background()
	for _, m := range n.c.Nodes {
		if m == n {
			continue
		}
		if _, err := n.Host.Run(ctx, "ip", "route", "replace", m.PodCIDR.String(), "via", m.Host.IPv4.String()); err != nil {
			return err
		}
	}
	_, err := n.Host.Run(ctx, "ip", "route", "replace", "default", "via", n.c.Lab.Router.IPv4.String())
	return err
}

// exec runs a short command in the node's network and mount namespaces.
func (n *Node) exec(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, n.c.bins.Nsenter, n.nsenterArgs(name, args...)...).CombinedOutput()
}

func (n *Node) nsenterArgs(name string, args ...string) []string {
	// -F: no fork, so the process started is the daemon itself.
	return append([]string{"-F", "-t", fmt.Sprint(n.holder.Cmd.Process.Pid), "-m", "-n", "--", name}, args...)
}

// Exec runs a command on the node (its network and mount namespaces) and returns its output.
func (n *Node) Exec(name string, args ...string) (string, error) {
	out, err := n.exec(name, args...)
	if err != nil {
		return string(out), fmt.Errorf("%s: %s %s: %v: %s", n.Name, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (n *Node) socket() string { return filepath.Join(n.Dir, "containerd", "containerd.sock") }

func (n *Node) writeConfigs() error {
	d := n.Dir
	files := map[string]string{
		"containerd/config.toml": fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE on these machines: runc cannot set the sandbox's oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, filepath.Join(d, "containerd/root"), filepath.Join(d, "containerd/state"), n.socket(), n.socket()+".ttrpc", filepath.Join(d, "cni")),
		"cni/10-bridge.conflist": fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "kubecluster", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
`, n.PodCIDR),
		"kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 controllers only on these machines (cgroup2 has none): allowed, with a warning.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
containerRuntimeEndpoint: unix://%s
staticPodPath: %s
podLogsDir: %s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
resolvConf: ""
clusterDomain: cluster.local
%simageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
`, n.cgroup, n.socket(), filepath.Join(d, "manifests"), filepath.Join(d, "podlogs"), n.Host.IPv4, n.c.clusterDNS()),
		"kube-proxy.yaml": fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: %s
clusterCIDR: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# 0: leave the machine-wide conntrack limits alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, n.c.Kubeconfig, n.Name, n.c.opts.ProxyMode, PodCIDR),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(d, name), []byte(data), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// start starts one daemon on the node, logging to a file; it is stopped when the test ends.
func (n *Node) start(name, bin string, args ...string) *testenv.Proc {
	return testenv.StartProc(n.c.t, fmt.Sprintf("%s-%s-%d", n.Name, name, n.starts), exec.Command(n.c.bins.Nsenter, n.nsenterArgs(bin, args...)...))
}

// Start starts the node's containerd, imports the images (first start only), and starts its
// kubelet and kube-proxy.
func (n *Node) Start() error {
	n.starts++
	n.containerd = n.start("containerd", n.c.bins.Containerd, "--config", filepath.Join(n.Dir, "containerd/config.toml"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		// containerd answers before its CRI plugin has recovered its state; a kubelet started
		// then exits ("server is not initialized yet"). The plugin's last step is the
		// streaming server.
		if _, err := n.exec(n.c.bins.Ctr, "--address", n.socket(), "version"); err == nil && strings.Contains(n.containerd.Output(), "Start streaming server") {
			break
		}
		select {
		case <-n.containerd.Done():
			return fmt.Errorf("containerd exited: %v\n%s", n.containerd.Err(), n.containerd.Tail(20))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not answering within 30s:\n%s", n.containerd.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n.starts == 1 {
		for _, img := range n.c.opts.Images {
			if out, err := n.exec(n.c.bins.Ctr, "--address", n.socket(), "-n", "k8s.io", "images", "import", img); err != nil {
				return fmt.Errorf("import %s: %v: %s", img, err, out)
			}
		}
	}
	n.startKubelet()
	n.startProxy()
	return nil
}

func (n *Node) startProxy() {
	n.proxy = n.start("kube-proxy", n.c.bins.KubeProxy, "--config", filepath.Join(n.Dir, "kube-proxy.yaml"), "--v=2")
}

// StopProxy stops the node's kube-proxy, as when it crashes or is being replaced: the rules it
// wrote stay in the kernel, its health servers go.
func (n *Node) StopProxy() {
	if n.proxy != nil {
		n.proxy.Stop(5 * time.Second)
	}
}

// StartProxy starts the node's kube-proxy again.
func (n *Node) StartProxy() { n.startProxy() }

func (n *Node) startKubelet() {
	n.kubelet = n.start("kubelet", n.c.bins.Kubelet, "--config", filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig", n.c.Kubeconfig, "--root-dir", filepath.Join(n.Dir, "kubelet"),
		"--cert-dir", filepath.Join(n.Dir, "kubelet", "pki"), "--hostname-override", n.Name,
		"--node-ip", n.Host.IPv4.String(), "--cloud-provider=external", "--v=2")
}

// stopDaemons stops kubelet, kube-proxy and containerd, and with hard also kills the node's
// containers and their shims (as if the machine lost power).
func (n *Node) stopDaemons(hard bool) {
	for _, p := range []*testenv.Proc{n.kubelet, n.proxy, n.containerd} {
		if p == nil {
			continue
		}
		if hard {
			p.Kill()
		} else {
			p.Stop(5 * time.Second)
		}
	}
	if !hard {
		return
	}
	// Shims name the node's containerd socket; containers live in the node's cgroups.
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err == nil && strings.Contains(string(b), n.socket()) {
			killPID(filepath.Base(p))
		}
	}
	_ = filepath.Walk(filepath.Join("/sys/fs/cgroup/pids", n.cgroup), func(path string, info os.FileInfo, err error) error {
		if err != nil || info.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, pid := range strings.Fields(string(b)) {
			killPID(pid)
		}
		return nil
	})
}

func killPID(pid string) {
	if p, err := strconv.Atoi(pid); err == nil && p > 1 {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// Kill makes the node die hard: its link goes down, and its kubelet, kube-proxy, containerd,
// shims and every container (the agent pod's included) are killed at once.
func (n *Node) Kill() error {
	if _, err := n.Host.Run(context.Background(), "ip", "link", "set", "eth0", "down"); err != nil {
		return err
	}
	n.stopDaemons(true)
	return nil
}

// Revive brings a killed node back, as a machine that reboots: link up, routes, containerd,
// kubelet and kube-proxy (which start its pods again).
func (n *Node) Revive() error {
	if _, err := n.Host.Run(context.Background(), "ip", "link", "set", "eth0", "up"); err != nil {
		return err
	}
	if err := n.podRoutes(); err != nil {
		return err
	}
	// Pods leave the node with its address, except towards other pods and Services: as Calico,
	// Cilium or Flannel do (the bridge CNI's ipMasq would masquerade everything off the node's own
	// pod range, and a pod on another node would see the node's address, not the pod's).
	if _, err := n.Host.Run(context.Background(), "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", n.PodCIDR.String(),
		"!", "-d", ClusterRanges.String(), "-m", "comment", "--comment", "kubecluster: pods to the outside", "-j", "MASQUERADE"); err != nil {
		return err
	}
	return n.Start()
}

// Reregister makes the node join anew, as a node reinstalled: its kubelet and kube-proxy stop,
// its Node object is deleted, and a new kubelet registers it again (tainted uninitialized,
// without a provider ID, until a CCM initialises it) beside a new kube-proxy (one whose Node
// went away stops following Services).
func (n *Node) Reregister(ctx context.Context) error {
	for _, p := range []*testenv.Proc{n.kubelet, n.proxy} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if err := n.c.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	n.starts++
	n.startKubelet()
	n.startProxy()
	return nil
}
