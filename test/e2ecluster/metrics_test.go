package e2ecluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/kubecluster"
)

// checkMetrics scrapes the CCM's /metrics (its secure port on node1) and every agent's (7474 on
// its node's address, the certificate verified against the CA of the ConfigMap metalvip-ca for
// the node's name) over TLS as Prometheus would: with the token of metalvip-metrics-reader
// (and, for the chart, the token Secret its monitors hand Prometheus) it gets metalvip_
// metrics; without a token 401 (403 from the CCM: anonymous, refused); with the token of a
// ServiceAccount not bound to metalvip:metrics-reader 403. The agents' probes stay open, and
// nothing listens on the node's loopback.
func checkMetrics(t *testing.T, c *kubecluster.Cluster, chart bool) {
	ctx := context.Background()
	ns := kubecluster.MetalvipNamespace
	token := func(sa string) string {
		t.Helper()
		tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	stranger := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "metrics-stranger"}}
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, stranger, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().ServiceAccounts(ns).Delete(context.Background(), stranger.Name, metav1.DeleteOptions{})
	})
	tokens := map[string]string{"the metrics reader's token": token("metalvip-metrics-reader")}
	if chart {
		// The Secret the monitors name: kube-controller-manager writes the token in.
		var secret string
		deadline := time.Now().Add(30 * time.Second)
		for secret == "" && time.Now().Before(deadline) {
			if s, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "metalvip-metrics-reader-token", metav1.GetOptions{}); err == nil {
				secret = string(s.Data["token"])
			}
			if secret == "" {
				time.Sleep(500 * time.Millisecond)
			}
		}
		if secret == "" {
			t.Fatal("the Secret metalvip-metrics-reader-token holds no token 30 s after the install")
		}
		tokens["the monitors' Secret token"] = secret
	}
	strangerToken := token(stranger.Name)

	ca, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "metalvip-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentCAs := x509.NewCertPool()
	if !agentCAs.AppendCertsFromPEM([]byte(ca.Data["ca.crt"])) {
		t.Fatal("the ConfigMap metalvip-ca holds no certificate")
	}
	type target struct {
		name, url string
		tls       *tls.Config
	}
	node1 := c.Node("node1")
	targets := []target{{
		// The CCM's serving certificate is the framework's self-signed one.
		name: "the CCM", url: fmt.Sprintf("https://%s:10258/metrics", node1.Host.IPv4),
		tls: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed by the cloud-provider framework
	}}
	for _, n := range c.Nodes {
		targets = append(targets, target{
			name: "the agent of " + n.Name, url: "https://" + netip.AddrPortFrom(n.Host.IPv4, 7474).String() + "/metrics",
			tls: &tls.Config{RootCAs: agentCAs, ServerName: n.Name},
		})
	}
	get := func(tg target, path, tok string) (int, string, error) {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: c.Lab.Control.DialContext, TLSClientConfig: tg.tls, DisableKeepAlives: true,
		}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(tg.url, "/metrics")+path, nil)
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
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		return resp.StatusCode, string(body), err
	}
	for _, tg := range targets {
		for what, tok := range tokens {
			// An agent serves its enrolled certificate once the CCM has enrolled it, and a CCM
			// just elected has no metalvip_ series until it has reached the agents: a few tries.
			var code int
			var body string
			var err error
			for range 30 {
				if code, body, err = get(tg, "/metrics", tok); err == nil && code == http.StatusOK && strings.Contains(body, "\nmetalvip_") {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil || code != http.StatusOK || !strings.Contains(body, "\nmetalvip_") {
				t.Errorf("%s with %s: %d %v, want 200 and metalvip_ metrics:\n%.300s", tg.name, what, code, err, body)
			}
		}
		// The CCM's framework takes a request without a token as system:anonymous, whom RBAC
		// refuses: 403 there; the agent asks for a token: 401.
		want := http.StatusUnauthorized
		if tg.name == "the CCM" {
			want = http.StatusForbidden
		}
		if code, body, err := get(tg, "/metrics", ""); err != nil || code != want {
			t.Errorf("%s without a token: %d %v, want %d:\n%.300s", tg.name, code, err, want, body)
		}
		if code, body, err := get(tg, "/metrics", strangerToken); err != nil || code != http.StatusForbidden {
			t.Errorf("%s with a ServiceAccount not bound to metalvip:metrics-reader: %d %v, want 403:\n%.300s", tg.name, code, err, body)
		}
		if strings.HasPrefix(tg.name, "the agent") {
			if code, _, err := get(tg, "/readyz", ""); err != nil || code != http.StatusOK {
				t.Errorf("%s /readyz without a token: %d %v, want 200 (kubelet's probe sends none)", tg.name, code, err)
			}
		}
	}
	for _, n := range c.Nodes {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := n.Host.DialContext(dctx, "tcp", net.JoinHostPort("127.0.0.1", "7474"))
		cancel()
		if err == nil {
			conn.Close()
			t.Errorf("the agent of %s answers on its loopback: --metrics-address is not the node's address alone", n.Name)
		}
	}
}
