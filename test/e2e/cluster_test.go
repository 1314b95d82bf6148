// Package e2e runs metalvip whole: a real kube-apiserver and etcd, the real CCM binary in the
// lab's control namespace, a real agent in each node namespace, FRR as the site's router and
// a client on the segment, and checks the failure model of docs/design.md on the wire.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

var ccmBinary, agentBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "metalvip-e2e-")
	if err != nil {
		panic(err)
	}
	for _, b := range []struct {
		dst *string
		pkg string
	}{{&ccmBinary, "./cmd/metalvip-cloud-controller-manager"}, {&agentBinary, "./cmd/metalvip-agent"}} {
		if *b.dst, err = testenv.GoBuild(dir, b.pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	defer os.RemoveAll(dir)
	kubeapi.Main(m)
}

// cluster is a whole metalvip installation in the lab.
type cluster struct {
	t      *testing.T // the test or subtest now running: assertions
	root   *testing.T // the test that built the cluster: processes live as long as it
	srv    *kubeapi.Server
	dyn    dynamic.Interface
	lab    *lab.Lab
	pki    string
	ns     string
	ccm    *testenv.Proc
	ccmCfg string
	kcfg   string
	agents map[string]*agent
	macs   map[string]string // MAC to node name
	ctx    context.Context
}

type agent struct {
	host   *lab.Host
	proc   *testenv.Proc
	state  string
	client agentv1.AgentServiceClient
}

// newCluster builds the lab and the API objects: 3 nodes, an agent on each, the CCM, an L2 and
// a BGP pool restricted to a fresh namespace, and the router as BGP peer.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	srv := kubeapi.Get(t)
	srv.InstallCRDs(t)
	l := lab.New(t, lab.Options{Nodes: 3})
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, root: t, srv: srv, dyn: dyn, lab: l, agents: map[string]*agent{}, macs: map[string]string{}, ctx: context.Background()}
	c.ns = srv.Namespace(t)
	c.writePKI()
	for _, n := range l.Nodes {
		c.createNode(n)
		c.macs[macOf(t, n)] = n.Name
		a := &agent{host: n, state: filepath.Join(t.TempDir(), "state")}
		c.agents[n.Name] = a
		c.startAgent(a)
	}
	// The CCM runs in the lab's control namespace and reaches the API server through a relay.
	u := strings.TrimPrefix(srv.URL, "https://")
	l.Control.Forward(t, "127.0.0.1:16443", u)
	cfg := rest.CopyConfig(srv.Config)
	cfg.Host = "https://127.0.0.1:16443"
	c.kcfg = srv.Kubeconfig(t, cfg)
	c.ccmCfg = filepath.Join(t.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(c.ccmCfg, fmt.Appendf(nil, `
agent:
  port: 7472
  caFile: %[1]s/ca.crt
  certFile: %[1]s/ccm.crt
  keyFile: %[1]s/ccm.key
  timeout: 2s
failover:
  interval: 50ms
  misses: 3
  keySecret: %[2]s/metalvip-heartbeat
allocation:
  pendingRetry: 1s
  poolStatusInterval: 200ms
`, c.pki, c.ns), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startCCM()
	c.object(v1alpha1.IPPoolResource, "l2-"+c.ns, fmt.Sprintf(`{addresses: ["203.0.113.0/27"], serviceAllocation: {namespaces: [%s]}}`, c.ns))
	c.object(v1alpha1.IPPoolResource, "bgp-"+c.ns, fmt.Sprintf(`{addresses: ["203.0.113.64/27"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP}}`, c.ns))
	c.object(v1alpha1.BGPPeerResource, "router-"+c.ns, `{address: 198.51.100.1, peerASN: 64496, myASN: 64497, bfd: {enabled: true, minRxMilliseconds: 100, minTxMilliseconds: 100, multiplier: 3}}`)
	return c
}

func (c *cluster) writePKI() {
	c.pki = c.t.TempDir()
	ca, err := certs.NewCA("metalvip-ca", time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	write := func(name string, p certs.Pair) {
		for ext, data := range map[string][]byte{".crt": p.Cert, ".key": p.Key} {
			if err := os.WriteFile(filepath.Join(c.pki, name+ext), data, 0o600); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	write("ca", ca)
	ccm, _ := certs.Issue(ca, certs.CCMName, certs.Client, time.Hour)
	write("ccm", ccm)
	for _, n := range c.lab.Nodes {
		p, _ := certs.Issue(ca, n.Name, certs.Server, time.Hour)
		write(n.Name, p)
	}
}

func (c *cluster) createNode(h *lab.Host) {
	nodes := c.srv.Client.CoreV1().Nodes()
	n, err := nodes.Create(c.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.Name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create node %s: %v", h.Name, err)
	}
	c.t.Cleanup(func() { _ = nodes.Delete(context.Background(), h.Name, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: h.IPv4.String()}, {Type: corev1.NodeHostName, Address: h.Name}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if _, err := nodes.UpdateStatus(c.ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) startAgent(a *agent) {
	h := a.host
	a.proc = h.Start(c.root, "agent", agentBinary,
		"--node-name", h.Name, "--listen-address", netip.AddrPortFrom(h.IPv4, 7472).String(),
		"--state-dir", a.state, "--interfaces", "eth0",
		"--tls-ca", filepath.Join(c.pki, "ca.crt"), "--tls-cert", filepath.Join(c.pki, h.Name+".crt"), "--tls-key", filepath.Join(c.pki, h.Name+".key"),
		"--v", "2")
	if a.client == nil {
		cfg, err := certs.ClientConfig(certs.Files{CA: filepath.Join(c.pki, "ca.crt"), Cert: filepath.Join(c.pki, "ccm.crt"), Key: filepath.Join(c.pki, "ccm.key")}, h.Name)
		if err != nil {
			c.t.Fatal(err)
		}
		dial := func(ctx context.Context, addr string) (net.Conn, error) {
			var conn net.Conn
			err := h.Do(func() error {
				var d net.Dialer
				var err error
				conn, err = d.DialContext(ctx, "tcp", addr)
				return err
			})
			return conn, err
		}
		conn, err := grpc.NewClient("passthrough:///"+netip.AddrPortFrom(h.IPv4, 7472).String(),
			grpc.WithTransportCredentials(credentials.NewTLS(cfg)), grpc.WithContextDialer(dial))
		if err != nil {
			c.t.Fatal(err)
		}
		c.root.Cleanup(func() { conn.Close() })
		a.client = agentv1.NewAgentServiceClient(conn)
	}
}

func (c *cluster) startCCM() {
	c.ccm = c.lab.Control.Start(c.root, "ccm", ccmBinary,
		"--kubeconfig", c.kcfg, "--cloud-config", c.ccmCfg,
		"--leader-elect=false", "--secure-port=0", "--controllers=service-lb-controller", "--v=2")
}

func (c *cluster) object(res interface{ String() string }, name, spec string) {
	c.t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		c.t.Fatal(err)
	}
	gvr := v1alpha1.IPPoolResource
	kind := "IPPool"
	if res == v1alpha1.BGPPeerResource {
		gvr, kind = v1alpha1.BGPPeerResource, "BGPPeer"
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "metadata": map[string]any{"name": name}, "spec": s,
	}}
	if _, err := c.dyn.Resource(gvr).Create(c.ctx, obj, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("create %s %s: %v", kind, name, err)
	}
	c.t.Cleanup(func() { _ = c.dyn.Resource(gvr).Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

type svcOpt func(*corev1.Service)

func local(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}
func inPool(p string) svcOpt {
	return func(s *corev1.Service) { s.Annotations = map[string]string{string(annotation.Pool): p} }
}

// service creates a LoadBalancer Service and waits for its address.
func (c *cluster) service(name string, opts ...svcOpt) netip.Addr {
	c.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	for _, o := range opts {
		o(s)
	}
	if _, err := c.srv.Client.CoreV1().Services(c.ns).Create(c.ctx, s, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	var ip netip.Addr
	eventually(c.t, 30*time.Second, name+" gets an address", func() bool {
		got, err := c.srv.Client.CoreV1().Services(c.ns).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil || len(got.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		ip, err = netip.ParseAddr(got.Status.LoadBalancer.Ingress[0].IP)
		return err == nil
	})
	return ip
}

// endpoints sets the Service's ready endpoints to one pod on each of nodes.
func (c *cluster) endpoints(svc string, nodes ...string) {
	c.t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: c.ns, Name: svc + "-slice", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for i, n := range nodes {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.244.%d.%d", i, 10+i)}, NodeName: ptr(n),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		})
	}
	slices := c.srv.Client.DiscoveryV1().EndpointSlices(c.ns)
	old, err := slices.Get(c.ctx, es.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(c.ctx, es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(c.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// owner returns the node whose agent answers ARP for vip at the client, or "".
func (c *cluster) owner(vip netip.Addr) string {
	return c.macs[whoAnswers(c.t, c.lab.Client, vip)]
}

func (c *cluster) waitOwner(vip netip.Addr, want string, timeout time.Duration) {
	c.t.Helper()
	eventually(c.t, timeout, fmt.Sprintf("%s answered by %s", vip, want), func() bool { return c.owner(vip) == want })
}

// eventually polls cond every 20 ms for up to timeout and returns how long it took.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func macOf(t *testing.T, h *lab.Host) string {
	t.Helper()
	var mac string
	if err := h.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = ifi.HardwareAddr.String()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// whoAnswers asks for vip by ARP from the client and returns the MAC that answered, or "".
func whoAnswers(t *testing.T, client *lab.Host, vip netip.Addr) string {
	t.Helper()
	var c *arp.Client
	if err := client.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Request(vip); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	_ = c.SetReadDeadline(deadline)
	for time.Now().Before(deadline) {
		p, _, err := c.Read()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return ""
			}
			continue
		}
		if p.Operation == arp.OperationReply && p.SenderIP == vip {
			return p.SenderHardwareAddr.String()
		}
	}
	return ""
}

// nextHops returns the next hops of the router's kernel route to vip, sorted.
func (c *cluster) nextHops(vip netip.Addr) []string {
	out, err := c.lab.Router.Run(context.Background(), "ip", "route", "show", vip.String())
	if err != nil {
		c.t.Fatal(err)
	}
	var hops []string
	for _, f := range strings.Fields(string(out)) {
		if a, err := netip.ParseAddr(f); err == nil && a != vip {
			hops = append(hops, a.String())
		}
	}
	slices.Sort(hops)
	return slices.Compact(hops)
}

// kill takes a node off the segment (link down) and kills its agent: a node dying hard.
func (c *cluster) kill(node string) {
	c.t.Helper()
	a := c.agents[node]
	if _, err := a.host.Run(c.ctx, "ip", "link", "set", "eth0", "down"); err != nil {
		c.t.Fatal(err)
	}
	a.proc.Kill()
}

// revive brings a killed node back: link up, agent started on its saved state.
func (c *cluster) revive(node string) {
	c.t.Helper()
	a := c.agents[node]
	if _, err := a.host.Run(c.ctx, "ip", "link", "set", "eth0", "up"); err != nil {
		c.t.Fatal(err)
	}
	// Link down removed the default route.
	_, _ = a.host.Run(c.ctx, "ip", "route", "replace", "default", "via", "198.51.100.1")
	c.startAgent(a)
}
