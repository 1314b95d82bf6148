package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/internal/certs"
)

func TestTheAgentsPKIServesMutualTLS(t *testing.T) {
	dir := AgentsDir(t, "node1")
	srv, err := certs.ServerConfig(Files(dir, "node1"), certs.CCMName, certs.ViewerName)
	if err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"ccm", "viewer"} {
		cli, err := certs.ClientConfig(Files(dir, client), "node1")
		if err != nil {
			t.Fatalf("%s: %v", client, err)
		}
		a, b := pipe(t)
		errc := make(chan error, 1)
		go func() { errc <- tls.Server(a, srv).Handshake() }()
		if err := tls.Client(b, cli).Handshake(); err != nil {
			t.Errorf("%s's handshake: %v", client, err)
		}
		if err := <-errc; err != nil {
			t.Errorf("node1 refused %s: %v", client, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v, %v; want mode 0600", fi, err)
	}
}

func TestTheAPIServersCertificateNamesItsAddresses(t *testing.T) {
	dir := t.TempDir()
	if err := APIServer(dir, time.Hour, netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	for _, name := range []string{"192.0.2.1", "kubernetes"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		t.Error("the Kubernetes CA's key was written; nothing needs it")
	}
}

func TestTheAdminTokenIsInTheTokenFile(t *testing.T) {
	dir := t.TempDir()
	tok, err := AdminToken(dir, "lab-admin")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "tokens.csv"))
	if want := tok + ",lab-admin,lab-admin,system:masters\n"; string(b) != want || len(tok) != 32 {
		t.Errorf("tokens.csv %q, want %q", b, want)
	}
	if _, err := ServiceAccount(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sa.pub")); !strings.HasPrefix(string(b), "-----BEGIN PUBLIC KEY-----") {
		t.Errorf("sa.pub: %q", b)
	}
}

func pipe(t *testing.T) (a, b net.Conn) {
	a, b = net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
