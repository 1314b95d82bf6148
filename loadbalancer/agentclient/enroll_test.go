package agentclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// signingCA is an Enroller that signs every request for the node asked (the TokenReview is
// identity's and the integration tests' business): what is left is the certificate path.
type signingCA struct {
	ca  certs.Pair
	ccm certs.Source
}

func newSigningCA(t *testing.T) *signingCA {
	t.Helper()
	ca, err := certs.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ccm, err := certs.Issue(ca, certs.CCMName, certs.Client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := certs.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "ccm.crt"), Key: filepath.Join(dir, "ccm.key")}
	for f, data := range map[string][]byte{files.CA: ca.Cert, files.Cert: ccm.Cert, files.Key: ccm.Key} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src, err := certs.FileSource(files)
	if err != nil {
		t.Fatal(err)
	}
	return &signingCA{ca: ca, ccm: src}
}

func (s *signingCA) Certificate() (*tls.Certificate, error) { return s.ccm.Certificate() }
func (s *signingCA) Pool() (*x509.CertPool, error)          { return s.ccm.Pool() }

func (s *signingCA) Sign(_ context.Context, node string, request []byte, _ string) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(request)
	if err != nil {
		return nil, err
	}
	return certs.IssueFor(s.ca, csr.PublicKey, node, certs.Server, time.Hour)
}

// enrollingAgent is an agent's enrollment and nothing else: its TLS is the Enrollee's (the
// certificate it serves, the CCM's it accepts), as metalvip-agent --tls-mode=enroll runs it.
type enrollingAgent struct {
	agentv1.UnimplementedAgentServiceServer
	node string
	e    *identity.Enrollee
}

func (a *enrollingAgent) Enroll(context.Context, *agentv1.EnrollRequest) (*agentv1.EnrollResponse, error) {
	r, err := a.e.Enroll()
	if err != nil {
		return nil, grpcstatus.Errorf(codes.FailedPrecondition, "enroll: %v", err)
	}
	return &agentv1.EnrollResponse{Node: r.Node, CertificateRequest: r.CertificateRequest, Token: r.Token}, nil
}

func (a *enrollingAgent) Install(_ context.Context, req *agentv1.InstallRequest) (*agentv1.InstallResponse, error) {
	if err := a.e.Install(req.GetCertificate()); err != nil {
		return nil, grpcstatus.Errorf(codes.InvalidArgument, "install: %v", err)
	}
	return &agentv1.InstallResponse{}, nil
}

func (a *enrollingAgent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	if !a.e.Enrolled() {
		return nil, grpcstatus.Error(codes.Unavailable, identity.ErrNotEnrolled.Error())
	}
	return &agentv1.GetStateResponse{Node: a.node}, nil
}

func (a *enrollingAgent) Watch(_ *agentv1.WatchRequest, s agentv1.AgentService_WatchServer) error {
	_ = s.SendHeader(metadata.MD{})
	<-s.Context().Done()
	return nil
}

// startEnrollingAgent serves node's enrollment on addr (port 0: any) with the CA of ca.
func startEnrollingAgent(t *testing.T, ca *signingCA, node string, addr netip.Addr) (*identity.Enrollee, int) {
	t.Helper()
	dir := t.TempDir()
	caFile, tokenFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(caFile, ca.ca.Cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := identity.NewEnrollee(identity.EnrolleeOptions{Node: node, CAFile: caFile, TokenFile: tokenFile, Dir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := certs.ServerConfigFrom(e, certs.CCMName)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(agentapi.ServerOptions(), grpc.Creds(credentials.NewTLS(cfg)))...)
	agentv1.RegisterAgentServiceServer(srv, &enrollingAgent{node: node, e: e})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return e, lis.Addr().(*net.TCPAddr).Port
}

// TestANodeNamedByAnIPAddressEnrolls: a Node named by its address (kubelet's
// --hostname-override=<ip>, as RKE sets it) is enrolled by the CCM, served a certificate the
// CCM accepts for that name, and reachable; it used to be enrolled again every few seconds,
// forever, its certificate naming the address as a DNS name that no TLS client matches. A node
// named by a DNS name is enrolled as before.
func TestANodeNamedByAnIPAddressEnrolls(t *testing.T) {
	for _, tc := range []struct {
		name, node string
		addr       netip.Addr
	}{
		{"a node named by an IPv4 address", "198.51.100.20", netip.MustParseAddr("127.0.0.43")},
		{"a node named by a DNS name", "node-1", netip.MustParseAddr("127.0.0.44")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := newSigningCA(t)
			e, port := startEnrollingAgent(t, ca, tc.node, tc.addr)
			a := New(Config{Port: port, Enroll: ca, Timeout: time.Second}, 1, Hooks{})
			defer a.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a.SetNodes(ctx, map[string]netip.Addr{tc.node: tc.addr})
			deadline := time.Now().Add(15 * time.Second)
			for !a.Reachable(tc.node) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent of %s was not enrolled and reached within 15s (enrolled: %v)", tc.node, e.Enrolled())
				}
				time.Sleep(20 * time.Millisecond)
			}
			c, err := e.Certificate()
			if err != nil {
				t.Fatal(err)
			}
			pool, _ := ca.Pool()
			if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: tc.node, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("the agent serves a certificate not valid for %s: %v", tc.node, err)
			}
		})
	}
}

// refusingCA refuses every enrollment, as a CA whose TokenReview always says no.
type refusingCA struct{ *signingCA }

func (refusingCA) Sign(_ context.Context, node string, _ []byte, _ string) ([]byte, error) {
	return nil, fmt.Errorf("%w: the agent dialled as %s holds a token of a Pod on elsewhere", identity.ErrRefused, node)
}

// syncBuffer is a log destination the connection goroutines write while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAnAgentThatCannotEnrollIsUnreachableForTheReason: an agent whose enrollment fails every
// time is unreachable, and the CCM's error says why the enrollment failed, not only that the
// agent's certificate is not trusted (what every retry would otherwise repeat in silence).
func TestAnAgentThatCannotEnrollIsUnreachableForTheReason(t *testing.T) {
	var logs syncBuffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	klog.SetOutput(&logs)
	t.Cleanup(func() { _ = fs.Set("logtostderr", "true"); klog.SetOutput(os.Stderr) })

	ca := newSigningCA(t)
	addr := netip.MustParseAddr("127.0.0.45")
	_, port := startEnrollingAgent(t, ca, "node-1", addr)
	a := New(Config{Port: port, Enroll: refusingCA{ca}, Timeout: time.Second}, 1, Hooks{})
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.SetNodes(ctx, map[string]netip.Addr{"node-1": addr})
	deadline := time.Now().Add(15 * time.Second)
	for {
		klog.Flush()
		out := logs.String()
		i := strings.Index(out, `"Agent unreachable"`)
		if i >= 0 {
			line, _, _ := strings.Cut(out[i:], "\n")
			if !strings.Contains(line, "enrolling it failed") || !strings.Contains(line, "holds a token of a Pod on elsewhere") {
				t.Errorf("the unreachable agent's error does not say why its enrollment failed:\n%s", line)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"Agent unreachable\" line within 15s; logs:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a.Reachable("node-1") {
		t.Error("an agent that was never enrolled is reachable")
	}
}
