package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// TestTheAgentServesMetricsToTheMetricsReaderAlone runs metalvip-agent with
// --metrics-auth=kubernetes against the real API server, with the RBAC of install.yaml and the
// token of its ServiceAccount kube-system/metalvip-agent (what kube-api-access mounts): over
// HTTPS with the certificate of its gRPC service (verified against the CA for its node's
// name), /readyz answers without a token, /metrics gives metalvip_agent_ metrics to the token
// of kube-system/metalvip-metrics-reader, 401 without a token or with a forged one, 403 to a
// ServiceAccount without the ClusterRole metalvip:metrics-reader.
func TestTheAgentServesMetricsToTheMetricsReaderAlone(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	ctx := context.Background()
	token := func(ns, sa string) string {
		t.Helper()
		tr, err := srv.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s/%s: %v", ns, sa, err)
		}
		return tr.Status.Token
	}
	ns := srv.Namespace(t)
	if _, err := srv.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "stranger"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(srv.Config)
	cfg.BearerToken = token("kube-system", "metalvip-agent")
	kubeconfig := srv.Kubeconfig(t, cfg)

	const node = "metrics-node"
	dir := pki.AgentsDir(t, node)
	files := pki.Files(dir, node)
	addr := netip.MustParseAddr("127.0.0.43")
	grpcPort, metricsPort := testenv.FreePort(t), testenv.FreePort(t)
	state := filepath.Join(t.TempDir(), "state")
	agent := testenv.StartProc(t, "agent-metrics", exec.Command(agentBin(t),
		"--node-name", node, "--listen-address", netip.AddrPortFrom(addr, uint16(grpcPort)).String(),
		"--metrics-address", netip.AddrPortFrom(addr, uint16(metricsPort)).String(), "--metrics-auth", "kubernetes", "--kubeconfig", kubeconfig,
		"--state-dir", state, "--interfaces", "lo", "--router-id", "198.51.100.10",
		"--tls-ca", files.CA, "--tls-cert", files.Cert, "--tls-key", files.Key))

	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: node}, DisableKeepAlives: true,
	}}
	base := "https://" + netip.AddrPortFrom(addr, uint16(metricsPort)).String()
	get := func(path, tok string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return 0, "", err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, err := get("/readyz", "")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz over HTTPS with the gRPC certificate for %s: %d %v within 20 s:\n%s", node, code, err, agent.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	reader, stranger := token("kube-system", "metalvip-metrics-reader"), token(ns, "stranger")
	for _, tc := range []struct {
		name, token string
		want        int
		body        string
	}{
		{"the metrics reader reads the agent's metrics", reader, http.StatusOK, "\nmetalvip_agent_build_info"},
		{"no token is unauthorised", "", http.StatusUnauthorized, "bearer token is required"},
		{"a forged token is unauthorised", reader[:len(reader)-4] + "AAAA", http.StatusUnauthorized, "not valid"},
		{"a ServiceAccount without metalvip:metrics-reader is forbidden", stranger, http.StatusForbidden, "metalvip:metrics-reader"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := get("/metrics", tc.token)
			if err != nil || code != tc.want || !strings.Contains(body, tc.body) {
				t.Fatalf("got %d %v %.200q, want %d with %q\n%s", code, err, body, tc.want, tc.body, agent.Tail(10))
			}
		})
	}
}
