package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// stateAgent answers GetState with a fixed state behind the agents' real server TLS
// (certs.ServerConfig, which admits only the CCM's identity). What is under test is how
// metalvipctl finds that identity; the agent's own GetState is tested with the agent.
type stateAgent struct {
	agentv1.UnimplementedAgentServiceServer
	node string
}

func (a stateAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	return &agentv1.GetStateResponse{Node: a.node, Term: 7, Generation: 42}, nil
}

func serveAgent(t *testing.T, certDir, node string) int {
	t.Helper()
	cfg, err := certs.ServerConfig(pki.Files(certDir, node), certs.CCMName, certs.ViewerName) // as the agent does
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	agentv1.RegisterAgentServiceServer(s, stateAgent{node: node})
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
	port := serveAgent(t, certDir, "ctl-node")
	createNode(t, srv, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-node"},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}},
	})
	kc := srv.Kubeconfig(t, nil)
	tmp := t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := exec.Command(ctlBinary, append([]string{"agent", "ctl-node", "--kubeconfig", kc, "--port", strconv.Itoa(port)}, args...)...)
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
