package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/nodeagent"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// inProcessAgent is the real agent logic (validation, fencing, generations, persistence)
// without speakers, served over mutual TLS on loopback addresses.
type inProcessAgent struct {
	agent *nodeagent.Agent
	port  int
}

func startAgent(t *testing.T, dir, node string, addrs ...netip.Addr) *inProcessAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a, err := nodeagent.New(ctx, nodeagent.Options{Node: node, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	tc, err := certs.ServerConfig(pki.Files(dir, node), certs.CCMName)
	if err != nil {
		t.Fatal(err)
	}
	srv := nodeagent.NewServer(a, credentials.NewTLS(tc), true)
	t.Cleanup(srv.Stop)
	ia := &inProcessAgent{agent: a}
	for range 20 { // the same port on every address
		var lis []net.Listener
		ok := true
		for i, addr := range addrs {
			l, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(ia.port)).String())
			if err != nil {
				ok = false
				break
			}
			if i == 0 {
				ia.port = l.Addr().(*net.TCPAddr).Port
			}
			lis = append(lis, l)
		}
		if !ok {
			for _, l := range lis {
				l.Close()
			}
			ia.port = 0
			continue
		}
		for _, l := range lis {
			go func() { _ = srv.Serve(l) }()
		}
		return ia
	}
	t.Fatal("no port free on every address")
	return nil
}

func (ia *inProcessAgent) state(t *testing.T) *agentv1.GetStateResponse {
	t.Helper()
	st, err := ia.agent.GetState(context.Background(), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (ia *inProcessAgent) announces(t *testing.T, vip string) bool {
	for _, an := range ia.state(t).GetState().GetAnnouncements() {
		if an.GetVip() == vip {
			return true
		}
	}
	return false
}

func announcingConfig(dir string, port int) string {
	return fmt.Sprintf(`
agent:
  port: %d
  %s
  timeout: 2s
allocation:
  pendingRetry: 1s
  poolStatusInterval: 200ms
`, port, pki.CCMConfig(dir))
}

func lbService(t *testing.T, srv *kubeapi.Server, ns, name, pool string) string {
	t.Helper()
	ctx := context.Background()
	_, err := srv.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"metalvip.io/pool": pool}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ip string
	harness.Eventually(t, 30*time.Second, name+" gets an address", func() bool {
		s, err := srv.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			ip = s.Status.LoadBalancer.Ingress[0].IP
		}
		return ip != ""
	})
	return ip
}

// TestAFutureTermDoesNotLockOutTheNextLeader: someone holding the CCM's key (or an older
// version's clock-based term) left a term far ahead in an agent; the next elected leader's term
// comes from its Lease, which it raises above the agent's, and the agent takes its states.
func TestAFutureTermDoesNotLockOutTheNextLeader(t *testing.T) {
	srv := kubeapi.Get(t)
	ctx := context.Background()
	node := "fence-" + rand.String(5)
	dir := pki.AgentsDir(t, node)
	addr := netip.MustParseAddr("127.0.0.21")
	agent := startAgent(t, dir, node, addr)
	createNode(t, srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}}})

	const future = 1 << 30
	if _, err := agent.agent.Apply(ctx, &agentv1.ApplyRequest{State: &agentv1.DesiredState{Term: future, Generation: 1, Node: node}}); err != nil {
		t.Fatalf("the rogue state: %v", err)
	}
	ns := srv.Namespace(t)
	createPool(t, srv, "fence-"+ns, fmt.Sprintf(`{"addresses": ["198.18.7.0/28"], "serviceAllocation": {"namespaces": [%q]}}`, ns))
	lease := "metalvip-fence-" + rand.String(5)
	startCCM(t, srv, announcingConfig(dir, agent.port), "--leader-elect=true", "--leader-elect-resource-name="+lease,
		"--controllers=service-lb-controller")
	vip := lbService(t, srv, ns, "web", "fence-"+ns)
	harness.Eventually(t, 60*time.Second, "the agent announces the new leader's VIP", func() bool { return agent.announces(t, vip) })
	st := agent.state(t)
	if st.GetTerm() <= future {
		t.Errorf("the agent holds term %d, not above the rogue %d", st.GetTerm(), future)
	}
	l, err := srv.Client.CoordinationV1().Leases("kube-system").Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := uint64(*l.Spec.LeaseTransitions) + 1; got != st.GetTerm() {
		t.Errorf("the agent's term %d is not the Lease's (transitions+1 = %d)", st.GetTerm(), got)
	}
	t.Logf("rogue term %d; the leader raised its Lease to term %d and the agent took it", uint64(future), st.GetTerm())
}

// TestARecreatedNodeConvergesOnItsAgent: a Node deleted and created again with another
// address is reached at the new one; generations resume from what the agent holds, so the
// agent takes the next change instead of treating it as applied already.
func TestARecreatedNodeConvergesOnItsAgent(t *testing.T) {
	srv := kubeapi.Get(t)
	ctx := context.Background()
	node := "moved-" + rand.String(5)
	dir := pki.AgentsDir(t, node)
	first, second := netip.MustParseAddr("127.0.0.22"), netip.MustParseAddr("127.0.0.23")
	agent := startAgent(t, dir, node, first, second)
	mk := func(a netip.Addr) {
		createNode(t, srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a.String()}}}})
	}
	mk(first)
	ns := srv.Namespace(t)
	createPool(t, srv, "moved-"+ns, fmt.Sprintf(`{"addresses": ["198.18.8.0/27"], "serviceAllocation": {"namespaces": [%q]}}`, ns))
	startCCM(t, srv, announcingConfig(dir, agent.port), "--controllers=service-lb-controller")
	a := lbService(t, srv, ns, "a", "moved-"+ns)
	harness.Eventually(t, 30*time.Second, "the agent announces a", func() bool { return agent.announces(t, a) })
	// A few more changes, so that the agent holds a generation well above 1: a connection that
	// started again from 1 would look applied already.
	for i := range 5 {
		vip := lbService(t, srv, ns, fmt.Sprintf("c%d", i), "moved-"+ns)
		harness.Eventually(t, 30*time.Second, "the agent announces "+vip, func() bool { return agent.announces(t, vip) })
	}
	gen := agent.state(t).GetGeneration()
	t.Logf("the agent holds generation %d before the Node is re-created", gen)

	if err := srv.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the Node is gone", func() bool {
		_, err := srv.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err != nil
	})
	mk(second)
	b := lbService(t, srv, ns, "b", "moved-"+ns)
	harness.Eventually(t, 30*time.Second, "the agent announces b too, reached at its new address", func() bool {
		return agent.announces(t, a) && agent.announces(t, b)
	})
	st := agent.state(t)
	if st.GetGeneration() <= gen {
		t.Errorf("generation %d after the Node came back, not above %d", st.GetGeneration(), gen)
	}
	var vips []string
	for _, an := range st.GetState().GetAnnouncements() {
		vips = append(vips, an.GetVip())
	}
	if !slices.Contains(vips, a) || !slices.Contains(vips, b) {
		t.Errorf("the agent holds %v, want %s and %s", vips, a, b)
	}
}

func createPool(t *testing.T, _ *kubeapi.Server, name, spec string) {
	t.Helper()
	newEnv(t).pool(name, spec)
}
