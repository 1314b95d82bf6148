package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metalvip/metalvip/internal/certs"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := certsCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestCertsWritesAWorkingSet(t *testing.T) {
	dir := t.TempDir()
	if _, err := run(t, "--nodes", "node-a,node-b", "--out", dir); err != nil {
		t.Fatal(err)
	}
	// The files make a server and a client configuration that accept each other.
	if _, err := certs.ServerConfig(certs.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "node-a.crt"), Key: filepath.Join(dir, "node-a.key")}, certs.CCMName); err != nil {
		t.Fatal(err)
	}
	leaf := loadLeaf(t, filepath.Join(dir, "node-b.crt"), filepath.Join(dir, "node-b.key"))
	if leaf.Subject.CommonName != "node-b" || leaf.DNSNames[0] != "node-b" || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("agent certificate %v %v %v", leaf.Subject, leaf.DNSNames, leaf.ExtKeyUsage)
	}
	ccm := loadLeaf(t, filepath.Join(dir, "ccm.crt"), filepath.Join(dir, "ccm.key"))
	if ccm.Subject.CommonName != certs.CCMName || ccm.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("CCM certificate %v %v", ccm.Subject, ccm.ExtKeyUsage)
	}
	// Adding a node later with the same CA.
	more := t.TempDir()
	if _, err := run(t, "--nodes", "node-c", "--out", more, "--ca-cert", filepath.Join(dir, "ca.crt"), "--ca-key", filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	c := loadLeaf(t, filepath.Join(more, "node-c.crt"), filepath.Join(more, "node-c.key"))
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	pool.AppendCertsFromPEM(ca)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "node-c"}); err != nil {
		t.Errorf("node-c's certificate does not chain to the first CA: %v", err)
	}
}

func loadLeaf(t *testing.T, cert, key string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCertsManifests(t *testing.T) {
	out, err := run(t, "--nodes", "node-a", "--manifests", "--out", t.TempDir(), "--namespace", "metalvip-system")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: metalvip-ccm-tls", "name: metalvip-agent-tls", "namespace: metalvip-system", "  node-a.crt: ", "  tls.key: "} {
		if !strings.Contains(out, want) {
			t.Errorf("manifests lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ca.key") {
		t.Error("the CA's key must not be in the Secrets")
	}
}

func TestCertsRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--out", "x"}, "--nodes is required"},
		{[]string{"--nodes", "Node_A", "--out", "x"}, `"Node_A" is not a node name`},
		{[]string{"--nodes", "a"}, "give --out DIR, --manifests, or both"},
		{[]string{"--nodes", "a", "--manifests"}, "keep ca.key"},
		{[]string{"--nodes", "a", "--out", "x", "--ca-cert", "c"}, "go together"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("certs %v = %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}
