package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	"github.com/metalvip/metalvip/loadbalancer/agentclient"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/nodetoken"
	"github.com/metalvip/metalvip/test/testenv"
)

// agentBin is metalvip-agent, built for the tests that run one.
var agentBin = testenv.Lazy(func() (string, error) {
	dir, err := os.MkdirTemp("", "metalvip-integration-agent-")
	if err != nil {
		return "", err
	}
	return testenv.GoBuild(dir, "./cmd/metalvip-agent")
})

// enrollEnv is one namespace holding what enrollment needs: the agents' ServiceAccount, the
// CA, and a Node per name.
type enrollEnv struct {
	t   *testing.T
	srv *kubeapi.Server
	ns  string
	ctx context.Context
	ca  string // the CA bundle as kubelet would mount it from the ConfigMap
	dir string
}

// newEnrollEnv is a namespace of the shared API server with the agents' ServiceAccount and
// another.
func newEnrollEnv(t *testing.T) *enrollEnv {
	t.Helper()
	srv := kubeapi.Get(t)
	e := &enrollEnv{t: t, srv: srv, ns: srv.Namespace(t), ctx: context.Background(), dir: t.TempDir()}
	for _, sa := range []string{"metalvip-agent", "someone-else"} {
		if err := nodetoken.ServiceAccount(e.ctx, srv.Client, e.ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *enrollEnv) node(name string) {
	e.t.Helper()
	createNode(e.t, e.srv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// token is a token of serviceAccount for audience, bound to a new Pod on node.
func (e *enrollEnv) token(pod, serviceAccount, node, audience string) (string, *corev1.Pod) {
	e.t.Helper()
	p, err := nodetoken.Pod(e.ctx, e.srv.Client, e.ns, pod, serviceAccount, node)
	if err != nil {
		e.t.Fatal(err)
	}
	tok, err := nodetoken.Token(e.ctx, e.srv.Client, p, audience, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok, p
}

// authority loads the CA (making it) and writes its bundle where an agent pod mounts it.
func (e *enrollEnv) authority(validity time.Duration) *identity.Authority {
	e.t.Helper()
	a := identity.NewAuthority(e.srv.Client, identity.AuthorityOptions{Namespace: e.ns, Validity: validity})
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := a.Load(ctx); err != nil {
		e.t.Fatal(err)
	}
	cm, err := e.srv.Client.CoreV1().ConfigMaps(e.ns).Get(e.ctx, identity.CAName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the CA ConfigMap: %v", err)
	}
	e.ca = filepath.Join(e.dir, "ca.crt")
	if err := pki.WritePair(e.dir, "ca", certs.Pair{Cert: []byte(cm.Data[identity.CAKey])}); err != nil {
		e.t.Fatal(err)
	}
	return a
}

// startAgent runs metalvip-agent in enroll mode on addr with token in its projected file.
func (e *enrollEnv) startAgent(node string, addr netip.AddrPort, token string) *testenv.Proc {
	e.t.Helper()
	dir := filepath.Join(e.dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return testenv.StartProc(e.t, "agent-"+node, exec.Command(agentBin(e.t),
		"--node-name", node, "--listen-address", addr.String(), "--state-dir", filepath.Join(dir, "state"),
		"--interfaces", "lo", "--router-id", "198.51.100.10", "--metrics-address", "",
		"--tls-mode", "enroll", "--tls-ca", e.ca, "--token-file", tokenFile, "--v", "2"))
}

// dialAgent connects to the agent of node as the CCM, checking the agent's certificate, and
// returns the connection and the certificate the agent served.
func dialAgent(t *testing.T, src certs.Source, node string, addr netip.AddrPort) (*grpc.ClientConn, *x509.Certificate) {
	t.Helper()
	var mu sync.Mutex
	var served *x509.Certificate
	cfg := certs.ClientConfigFrom(src, node)
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		mu.Lock()
		served = cs.PeerCertificates[0]
		mu.Unlock()
		return verify(cs)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr.String(), append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := agentv1.NewAgentServiceClient(conn).GetState(ctx, &agentv1.GetStateRequest{}); err != nil {
		conn.Close()
		t.Fatalf("GetState from %s's agent as the CCM: %v", node, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return conn, served
}

// TestAnAgentIsEnrolledForItsNodeAndRenewedWithoutADroppedStream: an agent with a token of
// its Pod on its Node, and nothing else, gets a certificate naming its node only from the
// CCM's connection manager (TokenReview through the real API server); it is renewed before
// expiry, twice, while a Watch stream stays up; an agent holding a token of a Pod on another node is
// never enrolled.
func TestAnAgentIsEnrolledForItsNodeAndRenewedWithoutADroppedStream(t *testing.T) {
	e := newEnrollEnv(t)
	nodeA, nodeB := e.ns+"-a", e.ns+"-b"
	e.node(nodeA)
	e.node(nodeB)
	tokA, _ := e.token("agent-a", "metalvip-agent", nodeA, identity.Audience)
	// The agent dialled as nodeB holds the token of nodeA's Pod (a node that stole it, or
	// a pod on nodeA posing as nodeB's agent).
	tokStolen, _ := e.token("agent-a-copy", "metalvip-agent", nodeA, identity.Audience)
	const validity = 30 * time.Second
	auth := e.authority(validity)
	port := testenv.FreePort(t)
	addrA := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.41"), uint16(port))
	addrB := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.42"), uint16(port))
	agentA := e.startAgent(nodeA, addrA, tokA)
	agentB := e.startAgent(nodeB, addrB, tokStolen)

	start := time.Now()
	agents := agentclient.New(agentclient.Config{Port: port, Enroll: auth, Timeout: 2 * time.Second}, 1, agentclient.Hooks{})
	ctx, cancel := context.WithCancel(context.Background())
	defer agents.Close()
	defer cancel()
	agents.SetNodes(ctx, map[string]netip.Addr{nodeA: addrA.Addr(), nodeB: addrB.Addr()})
	for !agents.Reachable(nodeA) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the agent of %s was not enrolled and reached within 30s:\n%s", nodeA, agentA.Tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("agent enrolled and reachable %s after the CCM's first dial", time.Since(start).Round(time.Millisecond))

	conn, first := dialAgent(t, auth, nodeA, addrA)
	defer conn.Close()
	t.Run("the certificate names its node only, for server usage, for the configured validity", func(t *testing.T) {
		if first.Subject.CommonName != nodeA || !slices.Equal(first.DNSNames, []string{nodeA}) ||
			len(first.IPAddresses) > 0 || len(first.URIs) > 0 || len(first.EmailAddresses) > 0 {
			t.Errorf("certificate names CN %q, DNS %v, IPs %v, URIs %v; want %s alone", first.Subject.CommonName, first.DNSNames, first.IPAddresses, first.URIs, nodeA)
		}
		if !slices.Equal(first.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || first.IsCA {
			t.Errorf("usage %v, CA %v; want server usage alone", first.ExtKeyUsage, first.IsCA)
		}
		if life := time.Until(first.NotAfter); life > validity || life < validity/2 {
			t.Errorf("valid for %s more; want about %s", life.Round(time.Second), validity)
		}
	})

	// A Watch stream open across the renewal.
	stream, err := agentv1.NewAgentServiceClient(conn).Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	streamEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				streamEnded <- err
				return
			}
		}
	}()
	// Renewed twice over the same connection: the second proves the CCM keeps track of a
	// certificate it renewed without a new handshake.
	seen := []*x509.Certificate{first}
	renewStart := time.Now()
	for len(seen) < 3 {
		if time.Since(renewStart) > 3*validity {
			t.Fatalf("%d renewals within %s (the last expires %s):\n%s", len(seen)-1, 3*validity, seen[len(seen)-1].NotAfter.Format(time.TimeOnly), agentA.Tail(20))
		}
		time.Sleep(500 * time.Millisecond)
		c, cert := dialAgent(t, auth, nodeA, addrA)
		c.Close()
		if last := seen[len(seen)-1]; cert.SerialNumber.Cmp(last.SerialNumber) != 0 {
			if !time.Now().Before(last.NotAfter) {
				t.Errorf("renewed at %s, after the last certificate expired at %s", time.Now().Format(time.TimeOnly), last.NotAfter.Format(time.TimeOnly))
			}
			t.Logf("renewal %d: %s before the last certificate's expiry", len(seen), time.Until(last.NotAfter).Round(time.Second))
			seen = append(seen, cert)
		}
	}
	renewed := seen[len(seen)-1]
	t.Run("the renewed certificate names the same node alone", func(t *testing.T) {
		if renewed.Subject.CommonName != nodeA || !slices.Equal(renewed.DNSNames, []string{nodeA}) {
			t.Errorf("renewed names CN %q DNS %v", renewed.Subject.CommonName, renewed.DNSNames)
		}
	})
	t.Run("the Watch stream opened before the renewal is still up", func(t *testing.T) {
		select {
		case err := <-streamEnded:
			t.Errorf("the Watch stream ended: %v", err)
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		if _, err := agentv1.NewAgentServiceClient(conn).GetState(cctx, &agentv1.GetStateRequest{}); err != nil {
			t.Errorf("the connection opened before the renewal: %v", err)
		}
	})
	t.Run("an agent holding a token of a Pod on another node is never enrolled", func(t *testing.T) {
		if agents.Reachable(nodeB) {
			t.Errorf("%s's agent is reachable with a token of a Pod on %s", nodeB, nodeA)
		}
		if out := agentB.Output(); strings.Contains(out, "Enrolled:") {
			t.Errorf("%s's agent says it was enrolled:\n%s", nodeB, agentB.Tail(10))
		}
	})
	t.Run("the node's key is kept on its disk alone, in no Secret", func(t *testing.T) {
		secrets, err := e.srv.Client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		key, err := os.ReadFile(filepath.Join(e.dir, nodeA, "state", "identity.key"))
		if err != nil {
			t.Fatalf("the enrolled key on the node's disk: %v", err)
		}
		for _, s := range secrets.Items {
			for k, v := range s.Data {
				if strings.Contains(string(v), strings.TrimSpace(string(key))) {
					t.Errorf("Secret %s/%s key %s holds the node's private key", s.Namespace, s.Name, k)
				}
			}
		}
	})
}

// TestANodeNamedByAnIPAddressIsEnrolled: a Node named by its address (kubelet's
// --hostname-override=<ip>, as RKE sets it) is enrolled through the real TokenReview like any
// other, and its certificate names the address as an IP SAN, the one place a TLS client looks
// for a name that is an address (issue 30, fault 4: it was a DNS SAN, and the CCM enrolled the
// node again every few seconds, forever).
func TestANodeNamedByAnIPAddressIsEnrolled(t *testing.T) {
	e := newEnrollEnv(t)
	const node = "198.51.100.20" // Nodes are cluster-wide: no other test names one so
	e.node(node)
	tok, _ := e.token("agent-ip", "metalvip-agent", node, identity.Audience)
	auth := e.authority(time.Hour)
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.43"), uint16(testenv.FreePort(t)))
	agent := e.startAgent(node, addr, tok)

	agents := agentclient.New(agentclient.Config{Port: int(addr.Port()), Enroll: auth, Timeout: 2 * time.Second}, 1, agentclient.Hooks{})
	ctx, cancel := context.WithCancel(context.Background())
	defer agents.Close()
	defer cancel()
	agents.SetNodes(ctx, map[string]netip.Addr{node: addr.Addr()})
	start := time.Now()
	for !agents.Reachable(node) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the agent of %s was not enrolled and reached within 30s:\n%s", node, agent.Tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, cert := dialAgent(t, auth, node, addr)
	defer conn.Close()
	ips := make([]string, 0, len(cert.IPAddresses))
	for _, ip := range cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	if cert.Subject.CommonName != node || len(cert.DNSNames) > 0 || !slices.Equal(ips, []string{node}) {
		t.Errorf("certificate names CN %q, DNS %v, IPs %v; want %s alone, as an IP SAN", cert.Subject.CommonName, cert.DNSNames, ips, node)
	}
	if n := strings.Count(agent.Output(), "Enrolled:"); n != 1 {
		t.Errorf("the agent says it was enrolled %d times; want once:\n%s", n, agent.Tail(20))
	}
}

// TestEnrollmentRefusesWhatDoesNotProveTheNode: the CCM's check of an agent's answer, through
// a real TokenReview: only a token of the agents' ServiceAccount, for the agents' audience,
// unexpired, bound to a live Pod on the node dialled, with a request signed by its key.
func TestEnrollmentRefusesWhatDoesNotProveTheNode(t *testing.T) {
	e := newEnrollEnv(t)
	node, other := e.ns+"-n", e.ns+"-o"
	e.node(node)
	e.node(other)
	auth := e.authority(time.Hour)
	good, _ := e.token("good", "metalvip-agent", node, identity.Audience)
	otherNode, _ := e.token("other-node", "metalvip-agent", other, identity.Audience)
	otherSA, _ := e.token("other-sa", "someone-else", node, identity.Audience)
	apiAudience, _ := e.token("api-audience", "metalvip-agent", node, "https://kubernetes.default.svc")
	deleted, pod := e.token("deleted", "metalvip-agent", node, identity.Audience)
	if err := e.srv.Client.CoreV1().Pods(e.ns).Delete(e.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.srv.Client, e.ns, pod.Name)
	expired, err := nodetoken.Expired(good, filepath.Join(e.srv.Dir, "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := nodetoken.Unbound(e.ctx, e.srv.Client, e.ns, "metalvip-agent", identity.Audience, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	request, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "any-name-at-all"}, DNSNames: []string{"kubernetes.default.svc"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	tampered := slices.Clone(request)
	tampered[len(tampered)-5] ^= 0xff

	for _, tc := range []struct {
		name    string
		token   string
		request []byte
		want    string // "" signs
	}{
		{"a token of a Pod on the node is signed, for the node alone", good, request, ""},
		{"a token of a Pod on another node is refused", otherNode, request, "holds a token of a Pod on " + other},
		{"an expired token is refused", expired, request, "not valid"},
		{"a token of another ServiceAccount is refused", otherSA, request, "not the agents' ServiceAccount"},
		{"a token for another audience is refused", apiAudience, request, "not valid"},
		{"a token of a deleted Pod is refused", deleted, request, "not valid"},
		{"a token bound to no Pod is refused", unbound, request, "bound to no Pod"},
		{"no token is refused", "", request, "sent no token"},
		{"a request whose signature does not verify is refused", good, tampered, "certificate request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := auth.Sign(e.ctx, node, tc.request, tc.token)
			if tc.want != "" {
				if !errors.Is(err, identity.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Sign = %v; want a refusal saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			c, err := parsePEMCert(cert)
			if err != nil {
				t.Fatal(err)
			}
			pool, _ := auth.Pool()
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: node, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("the certificate does not chain to the CA for %s: %v", node, err)
			}
			if c.Subject.CommonName != node || !slices.Equal(c.DNSNames, []string{node}) || !key.PublicKey.Equal(c.PublicKey) {
				t.Errorf("certificate for CN %q DNS %v; want %s alone, the request's key (what the request asked is ignored)", c.Subject.CommonName, c.DNSNames, node)
			}
		})
	}
}

func parsePEMCert(data []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("no PEM certificate in %q", data)
	}
	return x509.ParseCertificate(b.Bytes)
}

func waitGone(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s still there: %v", ns, name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTheAgentsServiceAccountMayReadNothing: with the manifests' RBAC, a token of the agents'
// ServiceAccount reads exactly what a ServiceAccount nobody bound reads (what Kubernetes gives
// every authenticated user, such as public ClusterTrustBundles), across every resource the API
// server lists, cluster-wide and in kube-system and default; Secrets, ConfigMaps, Pods, Nodes,
// Services, Leases and metalvip's own objects are all refused. Its projected token (the
// enrollment audience) is not even accepted by the API server.
func TestTheAgentsServiceAccountMayReadNothing(t *testing.T) {
	srv := kubeapi.Get(t)
	applyManifests(t, srv)
	ctx := context.Background()
	if err := nodetoken.ServiceAccount(ctx, srv.Client, "default", "metalvip-test-unbound"); err != nil {
		t.Fatal(err)
	}
	pod, err := nodetoken.Pod(ctx, srv.Client, "kube-system", "metalvip-agent-rbac-test", "metalvip-agent", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Client.CoreV1().Pods("kube-system").Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	})
	const apiAudience = "https://kubernetes.default.svc"
	agentToken, err := nodetoken.Token(ctx, srv.Client, pod, apiAudience, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	projected, err := nodetoken.Token(ctx, srv.Client, pod, identity.Audience, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	unboundToken, err := nodetoken.Unbound(ctx, srv.Client, "default", "metalvip-test-unbound", apiAudience, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	as := func(token string) dynamic.Interface {
		cfg := rest.CopyConfig(srv.Config)
		cfg.BearerToken = token
		d, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	agent, unbound := as(agentToken), as(unboundToken)
	lists, err := srv.Client.Discovery().ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	mustRefuse := map[string]bool{"secrets": true, "configmaps": true, "pods": true, "nodes": true, "services": true, "leases": true, "ippools": true, "bgppeers": true, "endpointslices": true}
	var reads, refused int
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			namespaces := []string{""}
			if r.Namespaced {
				namespaces = append(namespaces, "kube-system", "default")
			}
			for _, ns := range namespaces {
				reads++
				_, err := agent.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
				_, base := unbound.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
				if apierrors.IsForbidden(err) {
					refused++
				}
				switch {
				case mustRefuse[r.Name] && !apierrors.IsForbidden(err):
					t.Errorf("list %s in %q as the agent: %v; want Forbidden", gvr, ns, err)
				case apierrors.IsForbidden(err) != apierrors.IsForbidden(base):
					t.Errorf("list %s in %q: the agent gets %v, a ServiceAccount nobody bound %v", gvr, ns, err, base)
				}
			}
		}
	}
	t.Logf("%d of %d reads refused to the agent, as to a ServiceAccount nobody bound (every resource that can be listed, cluster-wide and in kube-system and default)", refused, reads)
	if reads < 40 {
		t.Errorf("only %d resources tried: discovery looks short", reads)
	}
	if _, err := as(projected).Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("kube-system").Get(ctx, identity.CAName, metav1.GetOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("the projected enrollment token read a Secret: %v; want Unauthorized (its audience is not the API server's)", err)
	}
}
