package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// stateAgent answers GetState with a fixed answer behind the agents' real server TLS
// (certs.ServerConfig, which admits the CCM's and the viewer's identities) and the agent's
// server options (agentapi.ServerOptions: its message limits). What is under test is how
// metalvipctl finds that identity and reads the answer; the agent's own GetState is tested
// with the agent.
type stateAgent struct {
	agentv1.UnimplementedAgentServiceServer
	resp *agentv1.GetStateResponse
}

func (a stateAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	return a.resp, nil
}

// serveAgent serves node's agent answering resp on a port of 127.0.0.1, with the node's
// certificate from certDir (metalvipctl certs --out).
func serveAgent(t *testing.T, certDir, node string, resp *agentv1.GetStateResponse) int {
	t.Helper()
	cfg, err := certs.ServerConfig(pki.Files(certDir, node), certs.CCMName, certs.ViewerName) // as the agent does
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append(agentapi.ServerOptions(), grpc.Creds(credentials.NewTLS(cfg)))...)
	agentv1.RegisterAgentServiceServer(s, stateAgent{resp: resp})
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().(*net.TCPAddr).Port
}

// TestMetalvipctlAgentTakesTheViewersIdentityFromItsSecret: `metalvipctl agent NODE` with no
// TLS flags reads the metalvip-viewer-tls Secret that `metalvipctl certs --manifests` made (an
// identity that may read an agent's state, never change it), as docs/operations.md says; it
// used to fail with "stat ca.crt: no such file". Without the Secret it says what to give
// instead.
func TestMetalvipctlAgentTakesTheViewersIdentityFromItsSecret(t *testing.T) {
	srv := kubeapi.Get(t)
	ns := srv.Namespace(t)
	certDir := t.TempDir()
	// Where the install docs put them: kube-system, the default of both commands.
	manifests, err := exec.Command(ctlBinary, "certs", "--nodes", "ctl-node", "--out", certDir, "--manifests").Output()
	if err != nil {
		t.Fatalf("metalvipctl certs: %v", err)
	}
	applyDocs(t, srv, parseDocs(t, "metalvipctl certs", manifests))
	port := serveAgent(t, certDir, "ctl-node", &agentv1.GetStateResponse{Node: "ctl-node", Term: 7, Generation: 42})
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-node"},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}},
	})
	kc := srv.Kubeconfig(t, nil)
	tmp := t.TempDir()
	run := func(args ...string) (string, error) {
		// Agents of files (metalvipctl certs): no CA ConfigMap in --ca-namespace (another
		// test may have made one in kube-system).
		cmd := exec.Command(ctlBinary, append([]string{"agent", "ctl-node", "--kubeconfig", kc, "--port", strconv.Itoa(port), "--ca-namespace", ns}, args...)...)
		cmd.Dir = t.TempDir() // no ca.crt or ccm.crt lying around
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
		ok   bool
	}{
		{"with no TLS flag it reads the Secret and finds the node's address", nil, "Agent ctl-node: term 7, generation 42", true},
		{"the CCM's Secret works too", []string{"--tls-secret", "kube-system/metalvip-ccm-tls"}, "Agent ctl-node: term 7", true},
		{"the files still work instead of the Secret", []string{"--address", "127.0.0.1", "--tls-ca", filepath.Join(certDir, "ca.crt"), "--tls-cert", filepath.Join(certDir, "viewer.crt"), "--tls-key", filepath.Join(certDir, "viewer.key")}, "Agent ctl-node: term 7", true},
		{"a missing Secret says what to give instead", []string{"--tls-secret", ns + "/nope"}, "give --tls-ca, --tls-cert and --tls-key", false},
		{"a Secret name without namespace is refused", []string{"--tls-secret", "metalvip-ccm-tls"}, "give NAMESPACE/NAME", false},
		{"the agents' Secret is no client identity", []string{"--tls-secret", "kube-system/metalvip-agent-tls"}, "has no tls.crt and tls.key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.args...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.want) {
				t.Fatalf("metalvipctl agent %v: %v, want ok=%v and %q in:\n%s", tc.args, err, tc.ok, tc.want, out)
			}
		})
	}
	// The Secret's key was written to a private folder for the call and removed after it.
	if left, _ := filepath.Glob(filepath.Join(tmp, "*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// heldState is the GetState answer of node holding n L2 VIPs, each with three candidates (node
// first for a third of them, a standby for the rest) and names of ordinary length, as a large
// node's agent gives it.
func heldState(node string, n int) *agentv1.GetStateResponse {
	st := &agentv1.DesiredState{Term: 3, Generation: 1 << 20, Node: node}
	resp := &agentv1.GetStateResponse{Node: node, Term: st.Term, Generation: st.Generation}
	for i := range n {
		vip := vipOf(i)
		an := &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{},
			Services: []string{fmt.Sprintf("team-payments-prod/checkout-frontend-%05d", i)}}
		for c := range 3 {
			name := fmt.Sprintf("worker-%04d.dc1.example.net", (i+c)%1000)
			if c == i%3 {
				name = node
			}
			an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: name, Address: fmt.Sprintf("198.51.100.%d", 1+(i+c)%250)})
		}
		av := &agentv1.AnnouncedVIP{Vip: vip, Mode: an.Mode, Active: i%3 == 0, Reason: "first candidate", Interfaces: []string{"bond0"}}
		if !av.Active {
			av.Reason = "standby: " + an.L2.Candidates[0].Node + " is alive and ranks higher"
		}
		st.Announcements = append(st.Announcements, an)
		resp.Announced = append(resp.Announced, av)
	}
	resp.State = st
	return resp
}

// vipOf is the i-th VIP of heldState, from 2001:db8::1 up (documentation addresses).
func vipOf(i int) string {
	return fmt.Sprintf("2001:db8::%x", i+1)
}

// TestMetalvipctlAgentShowsANodeHoldingTwentyThousandVIPs: `metalvipctl agent NODE` reads an
// agent's whole answer up to the contract's limit (agentapi.ClientOptions), from a server with
// the agent's own (agentapi.ServerOptions). It dialled with gRPC's default receive limit and
// failed with "received message larger than max" on a node whose answer passed it, while the
// agent and the CCM handle far larger states.
func TestMetalvipctlAgentShowsANodeHoldingTwentyThousandVIPs(t *testing.T) {
	const node, n = "worker-0999.dc1.example.net", 20_000
	certDir := t.TempDir()
	if out, err := exec.Command(ctlBinary, "certs", "--nodes", node, "--out", certDir).CombinedOutput(); err != nil {
		t.Fatalf("metalvipctl certs: %v\n%s", err, out)
	}
	resp := heldState(node, n)
	if size := proto.Size(resp); size <= 4<<20 {
		t.Fatalf("the answer is %d bytes: the test needs one over gRPC's default receive limit of 4 MiB", size)
	}
	port := serveAgent(t, certDir, node, resp)
	cmd := exec.Command(ctlBinary, "agent", node, "--address", "127.0.0.1", "--port", strconv.Itoa(port),
		"--tls-ca", filepath.Join(certDir, "ca.crt"), "--tls-cert", filepath.Join(certDir, "viewer.crt"), "--tls-key", filepath.Join(certDir, "viewer.key"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("metalvipctl agent %s: %v\n%s", node, err, stderr.String())
	}
	var vips []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "2001:db8::") {
			vips = append(vips, f[0])
		}
	}
	if len(vips) != n || vips[0] != vipOf(0) || vips[n-1] != vipOf(n-1) {
		first, last := "", ""
		if len(vips) > 0 {
			first, last = vips[0], vips[len(vips)-1]
		}
		t.Fatalf("metalvipctl agent shows %d VIPs from %s to %s, want %d from %s to %s", len(vips), first, last, n, vipOf(0), vipOf(n-1))
	}
	if !strings.HasPrefix(string(out), "Agent "+node+": term 3") {
		t.Errorf("metalvipctl agent does not start with the agent's term:\n%.200s", out)
	}
}
