// Package cluster assembles metalvip whole in the lab for end-to-end tests and the demo: a real
// kube-apiserver, the CCM binary in the lab's control namespace (reaching the API server
// through a relay), an agent binary in every node namespace with mutual TLS (enrolled by the
// CCM, as installed: a Pod bound to each Node and its projected token made as kubelet would;
// or hand-made certificates, Options.Files), pools and a BGP peer, and helpers to create
// Services and watch the wire.
package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/nodetoken"
	"github.com/metalvip/metalvip/test/testenv"
)

// Options shape a cluster.
type Options struct {
	Nodes       int // default 3
	ClientAddrs int // extra addresses on the client (lab.Options)
	// CCMBinary and AgentBinary are the built binaries (see Build).
	CCMBinary, AgentBinary string
	// CloudConfig is added to the CCM's cloud-config (YAML, top-level fields not set here).
	CloudConfig string
	// Controllers is the CCM's --controllers (default service-lb-controller: the lab's nodes
	// have no kubelet).
	Controllers string
	// Files gives the agents hand-made certificates (metalvipctl certs' way) instead of
	// enrolling them.
	Files bool
	// Joined is how many of the lab's nodes are in the cluster from the start (default all);
	// the others join with Join.
	Joined int
	// HeartbeatInterval and HeartbeatMisses are the CCM's failover.interval and
	// failover.misses (default 50ms and 3).
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	// LeaderElect runs the CCM with leader election (a Lease of the cluster's namespace, short
	// timers: 4 s lease, 3 s renew deadline, 500 ms retry), so that replicas race for it.
	LeaderElect bool
	// AgentArgs are added to every agent's command line.
	AgentArgs []string
	// Router and IBGP choose the router's BGP implementation and iBGP sessions (lab.Options);
	// the BGPPeer's myASN follows.
	Router string
	IBGP   bool
	// Unnumbered peers the nodes with the router over BGP unnumbered: the lab's
	// point-to-point links (lab.Options.Unnumbered) and a BGPPeer with interface
	// lab.UnnumberedLink instead of the router's address.
	Unnumbered bool
}

// Build builds the CCM and agent binaries into dir.
func Build(dir string) (ccm, agent string, err error) {
	if ccm, err = testenv.GoBuild(dir, "./cmd/metalvip-cloud-controller-manager"); err != nil {
		return "", "", err
	}
	agent, err = testenv.GoBuild(dir, "./cmd/metalvip-agent")
	return ccm, agent, err
}

// Cluster is a whole metalvip installation in the lab.
type Cluster struct {
	// T is the test (or subtest) running now: assertions go to it. Root built the cluster:
	// processes live as long as it.
	T      testenv.TB
	Root   testenv.TB
	Srv    *kubeapi.Server
	Dyn    dynamic.Interface
	Lab    *lab.Lab
	NS     string // the namespace of the cluster's Services and pools
	CCM    *testenv.Proc
	Agents map[string]*Agent
	MACs   map[string]string // MAC to node name
	PKI    string            // folder of the CA and certificates (ca.crt, ccm.crt, ccm.key)
	opts   Options
	ccmCfg string
	// tlsConfig is the agent section's TLS or enrolment lines of the CCM's cloud-config.
	tlsConfig string
	kcfg      string
	ctx       context.Context
}

type Agent struct {
	Host   *lab.Host
	Proc   *testenv.Proc
	State  string // the agent's --state-dir
	Token  string // enrolled: the agent's projected token file
	Client agentv1.AgentServiceClient
}

// New builds the lab and the API objects: the nodes, an agent on each, the CCM, an L2 pool
// ("l2-<namespace>", 203.0.113.0/27) and a BGP pool ("bgp-<namespace>", 203.0.113.64/27,
// only by name) for a fresh namespace, and the router as BGP peer.
func New(t testenv.TB, srv *kubeapi.Server, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Controllers == "" {
		opts.Controllers = "service-lb-controller"
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 50 * time.Millisecond
	}
	if opts.HeartbeatMisses == 0 {
		opts.HeartbeatMisses = 3
	}
	srv.InstallCRDs(t)
	l := lab.New(t, lab.Options{Nodes: opts.Nodes, ClientAddrs: opts.ClientAddrs, Router: opts.Router, IBGP: opts.IBGP, Unnumbered: opts.Unnumbered})
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatalf("%v", err)
	}
	c := &Cluster{T: t, Root: t, Srv: srv, Dyn: dyn, Lab: l, Agents: map[string]*Agent{}, MACs: map[string]string{}, opts: opts, ctx: context.Background()}
	c.NS = srv.Namespace(t)
	if opts.Joined == 0 {
		opts.Joined = len(l.Nodes)
	}
	c.opts = opts
	for _, n := range l.Nodes {
		c.MACs[n.MAC(t)] = n.Name
	}
	// The CCM runs in the lab's control namespace and reaches the API server through a relay.
	u := strings.TrimPrefix(srv.URL, "https://")
	l.Control.Forward(t, "127.0.0.1:16443", u)
	cfg := rest.CopyConfig(srv.Config)
	cfg.Host = "https://127.0.0.1:16443"
	c.kcfg = srv.Kubeconfig(t, cfg)
	c.ccmCfg = filepath.Join(t.TempDir(), "cloud-config.yaml")
	c.PKI = t.TempDir()
	tlsConfig := pki.CCMConfig(c.PKI)
	if !opts.Files {
		// The CA, its ConfigMap and the agents' ServiceAccount in the cluster's namespace: each
		// test's cluster has a CA of its own.
		tlsConfig = fmt.Sprintf(`enroll: {enabled: true, namespace: %s}`, c.NS)
		if err := nodetoken.ServiceAccount(c.ctx, srv.Client, c.NS, "metalvip-agent"); err != nil {
			t.Fatalf("%v", err)
		}
	}
	c.tlsConfig = tlsConfig
	c.writeCCMConfig()
	if opts.Files {
		c.writePKI()
	} else {
		// As installed: the CCM starts first and publishes the CA; kubelet starts the agents
		// once the ConfigMap exists.
		c.StartCCM()
		c.readCA()
	}
	for _, n := range l.Nodes[:opts.Joined] {
		c.Join(n.Name)
	}
	if opts.Files {
		c.StartCCM()
	} else {
		// Tests start from a cluster whose agents all answer, as they did when agents came
		// first: wait until each is enrolled (it answers over mutual TLS, which the CCM reached
		// just before). Each is enrolled at the CCM's next try, up to its 10 s backoff.
		start := time.Now()
		for _, n := range l.Nodes[:opts.Joined] {
			a := c.Agents[n.Name]
			harness.Eventually(t, 30*time.Second, n.Name+"'s agent is enrolled", func() bool {
				ctx, cancel := context.WithTimeout(c.ctx, time.Second)
				defer cancel()
				_, err := a.Client.GetState(ctx, &agentv1.GetStateRequest{})
				return err == nil
			})
		}
		t.Logf("every agent enrolled %s after it started", time.Since(start).Round(time.Millisecond))
	}
	// No namespace controller runs here: the namespace's Services would outlive the test, and
	// later tests' CCMs would announce them in their labs.
	t.Cleanup(c.deleteServices)
	c.Object(v1alpha1.IPPoolResource, "l2-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.0/27"], avoidBuggyIPs: true, serviceAllocation: {namespaces: [%s]}}`, c.NS))
	bgpPool, bgpSpec := c.BGPPool()
	c.Object(v1alpha1.IPPoolResource, bgpPool, bgpSpec)
	myASN := 64497
	if opts.IBGP {
		myASN = 64496
	}
	session := "address: 198.51.100.1"
	if opts.Unnumbered {
		session = "interface: " + lab.UnnumberedLink
	}
	c.Object(v1alpha1.BGPPeerResource, "router-"+c.NS, fmt.Sprintf(`{%s, peerASN: 64496, myASN: %d, bfd: {enabled: true, minRxMilliseconds: 100, minTxMilliseconds: 100, multiplier: 3}}`, session, myASN))
	return c
}

// BGPPool returns the name and spec of the cluster's BGP pool (203.0.113.64/27, only for the
// cluster's namespace and only by name).
func (c *Cluster) BGPPool() (name, spec string) {
	return "bgp-" + c.NS, fmt.Sprintf(`{addresses: ["203.0.113.64/27"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP}}`, c.NS)
}

// writeCCMConfig writes the CCM's cloud-config from the options.
func (c *Cluster) writeCCMConfig() {
	if err := os.WriteFile(c.ccmCfg, fmt.Appendf(nil, `
agent:
  port: 7472
  %[1]s
  timeout: 2s
failover:
  interval: %[3]s
  misses: %[4]d
allocation:
  pendingRetry: 1s
  poolStatusInterval: 200ms
%[2]s
`, c.tlsConfig, c.opts.CloudConfig, c.opts.HeartbeatInterval, c.opts.HeartbeatMisses), 0o600); err != nil {
		c.T.Fatalf("%v", err)
	}
}

// SetHeartbeat restarts the CCM with another failover.interval and failover.misses; the agents
// take them with the state it pushes them.
func (c *Cluster) SetHeartbeat(interval time.Duration, misses int) {
	c.T.Helper()
	c.opts.HeartbeatInterval, c.opts.HeartbeatMisses = interval, misses
	c.writeCCMConfig()
	c.CCM.Stop(10 * time.Second)
	c.StartCCM()
}

// Join adds a lab node to the cluster as a new node does: its Node object, then (enrolled)
// its agent Pod and projected token, then its agent. Nothing else: no certificate is made for
// it.
func (c *Cluster) Join(node string) {
	c.T.Helper()
	var h *lab.Host
	for _, n := range c.Lab.Nodes {
		if n.Name == node {
			h = n
		}
	}
	if h == nil {
		c.T.Fatalf("no lab node %s", node)
	}
	c.createNode(h)
	a := &Agent{Host: h, State: filepath.Join(c.Root.TempDir(), "state")}
	if !c.opts.Files {
		a.Token = filepath.Join(c.Root.TempDir(), "token")
		c.agentToken(h.Name, a.Token)
	}
	c.Agents[h.Name] = a
	c.StartAgent(a)
}

// agentToken does kubelet's part: a Pod of the agents' ServiceAccount bound to the node, and
// its projected token (audience metalvip-agent) in file.
func (c *Cluster) agentToken(node, file string) {
	pods := c.Srv.Client.CoreV1().Pods(c.NS)
	pod, err := nodetoken.Pod(c.ctx, c.Srv.Client, c.NS, "metalvip-agent-"+node, "metalvip-agent", node)
	if err != nil {
		c.T.Fatalf("the agent pod of %s: %v", node, err)
	}
	c.Root.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pods.Delete(ctx, pod.Name, metav1.DeleteOptions{})
	})
	tok, err := nodetoken.Token(c.ctx, c.Srv.Client, pod, identity.Audience, time.Hour)
	if err != nil {
		c.T.Fatalf("%v", err)
	}
	if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
		c.T.Fatalf("%v", err)
	}
}

// readCA waits for the CA the CCM publishes, writes it where an agent pod mounts it, and
// gives the test a CCM identity of it (ccm.crt, ccm.key) to call agents and metalvipctl with.
func (c *Cluster) readCA() {
	var cm *corev1.ConfigMap
	harness.Eventually(c.T, 30*time.Second, "the CCM publishes the agents' CA", func() bool {
		var err error
		cm, err = c.Srv.Client.CoreV1().ConfigMaps(c.NS).Get(c.ctx, identity.CAName, metav1.GetOptions{})
		return err == nil && cm.Data[identity.CAKey] != ""
	})
	if err := pki.WritePair(c.PKI, "ca", certs.Pair{Cert: []byte(cm.Data[identity.CAKey])}); err != nil {
		c.T.Fatalf("%v", err)
	}
	sec, err := c.Srv.Client.CoreV1().Secrets(c.NS).Get(c.ctx, identity.CAName, metav1.GetOptions{})
	if err != nil {
		c.T.Fatalf("the CA Secret: %v", err)
	}
	ca := certs.Pair{Cert: sec.Data[corev1.TLSCertKey], Key: sec.Data[corev1.TLSPrivateKeyKey]}
	if err := pki.Issue(c.PKI, "ccm", ca, certs.CCMName, certs.Client, time.Hour); err != nil {
		c.T.Fatalf("%v", err)
	}
}

func (c *Cluster) writePKI() {
	if _, err := pki.Agents(c.PKI, "", time.Hour, lab.Names(c.Lab.Nodes)...); err != nil {
		c.T.Fatalf("the agents' PKI: %v", err)
	}
}

func (c *Cluster) createNode(h *lab.Host) {
	nodes := c.Srv.Client.CoreV1().Nodes()
	n, err := nodes.Create(c.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.Name}}, metav1.CreateOptions{})
	if err != nil {
		c.T.Fatalf("create node %s: %v", h.Name, err)
	}
	c.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = nodes.Delete(ctx, h.Name, metav1.DeleteOptions{})
	})
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: h.IPv4.String()}, {Type: corev1.NodeHostName, Address: h.Name}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if _, err := nodes.UpdateStatus(c.ctx, n, metav1.UpdateOptions{}); err != nil {
		c.T.Fatalf("%v", err)
	}
}

func (c *Cluster) StartAgent(a *Agent) {
	h := a.Host
	args := []string{"--node-name", h.Name, "--listen-address", netip.AddrPortFrom(h.IPv4, 7472).String(),
		"--state-dir", a.State, "--interfaces", "eth0", "--tls-ca", filepath.Join(c.PKI, "ca.crt"), "--v", "2"}
	if c.opts.Files {
		args = append(args, "--tls-cert", filepath.Join(c.PKI, h.Name+".crt"), "--tls-key", filepath.Join(c.PKI, h.Name+".key"))
	} else {
		args = append(args, "--tls-mode", "enroll", "--token-file", a.Token)
	}
	args = append(args, c.opts.AgentArgs...)
	a.Proc = h.Start(c.Root, "agent", c.opts.AgentBinary, args...)
	if a.Client == nil {
		cfg, err := certs.ClientConfig(pki.Files(c.PKI, "ccm"), h.Name)
		if err != nil {
			c.T.Fatalf("%v", err)
		}
		conn, err := grpc.NewClient("passthrough:///"+netip.AddrPortFrom(h.IPv4, 7472).String(),
			append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithContextDialer(h.DialTCP))...)
		if err != nil {
			c.T.Fatalf("%v", err)
		}
		c.Root.Cleanup(func() { conn.Close() })
		a.Client = agentv1.NewAgentServiceClient(conn)
	}
}

// StartCCM starts the CCM as c.CCM (with leader election if Options.LeaderElect).
func (c *Cluster) StartCCM() {
	c.CCM = c.StartCCMReplica("ccm", c.LeaderElectFlags()...)
}

// LeaderElectFlags are the CCM's leader-election flags for Options.LeaderElect.
func (c *Cluster) LeaderElectFlags() []string {
	if !c.opts.LeaderElect {
		return []string{"--leader-elect=false"}
	}
	return []string{"--leader-elect=true", "--leader-elect-resource-namespace=" + c.NS, "--leader-elect-resource-name=metalvip",
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}
}

// StartCCMReplica starts another CCM process named name with extra flags (such as leader
// election settings) and returns it.
func (c *Cluster) StartCCMReplica(name string, extra ...string) *testenv.Proc {
	args := append([]string{"--kubeconfig", c.kcfg, "--cloud-config", c.ccmCfg,
		"--secure-port=0", "--controllers=" + c.opts.Controllers, "--v=2"}, extra...)
	return c.Lab.Control.Start(c.Root, name, c.opts.CCMBinary, args...)
}

// Object creates an IPPool or a BGPPeer from YAML for spec; it is deleted at the end.

func (c *Cluster) Object(res interface{ String() string }, name, spec string) {
	c.T.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		c.T.Fatalf("%v", err)
	}
	gvr := v1alpha1.IPPoolResource
	kind := "IPPool"
	if res == v1alpha1.BGPPeerResource {
		gvr, kind = v1alpha1.BGPPeerResource, "BGPPeer"
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "metadata": map[string]any{"name": name}, "spec": s,
	}}
	if _, err := c.Dyn.Resource(gvr).Create(c.ctx, obj, metav1.CreateOptions{}); err != nil {
		c.T.Fatalf("create %s %s: %v", kind, name, err)
	}
	c.T.Cleanup(func() {
		// Bounded: a teardown must end even when the API server no longer answers.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Dyn.Resource(gvr).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// Kubeconfig is the admin kubeconfig that works from the lab's control namespace (through
// the relay), as the CCM uses it.
func (c *Cluster) Kubeconfig() string { return c.kcfg }
