package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

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

func TestCertsManifestsAreTheFilesAsSecrets(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "--nodes", "node-a,node-b", "--manifests", "--out", dir, "--namespace", "metalvip-system")
	if err != nil {
		t.Fatal(err)
	}
	file := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	want := map[string]map[string][]byte{
		"metalvip-ccm-tls":    {"ca.crt": file("ca.crt"), "tls.crt": file("ccm.crt"), "tls.key": file("ccm.key")},
		"metalvip-viewer-tls": {"ca.crt": file("ca.crt"), "tls.crt": file("viewer.crt"), "tls.key": file("viewer.key")},
		"metalvip-agent-tls": {"ca.crt": file("ca.crt"), "node-a.crt": file("node-a.crt"), "node-a.key": file("node-a.key"),
			"node-b.crt": file("node-b.crt"), "node-b.key": file("node-b.key")},
	}
	docs := strings.Split(out, "\n---\n")
	if len(docs) != len(want) {
		t.Fatalf("%d documents; want %d:\n%s", len(docs), len(want), out)
	}
	for _, doc := range docs {
		var s corev1.Secret
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("a document is no Secret: %v\n%s", err, doc)
		}
		if s.APIVersion != "v1" || s.Kind != "Secret" || s.Namespace != "metalvip-system" || s.Type != corev1.SecretTypeOpaque {
			t.Errorf("%s: %s %s in %q, type %q", s.Name, s.APIVersion, s.Kind, s.Namespace, s.Type)
		}
		w, ok := want[s.Name]
		if !ok {
			t.Errorf("unexpected Secret %s", s.Name)
			continue
		}
		delete(want, s.Name)
		if !maps.EqualFunc(s.Data, w, bytes.Equal) {
			t.Errorf("%s holds %v; want the files %v", s.Name, slices.Sorted(maps.Keys(s.Data)), slices.Sorted(maps.Keys(w)))
		}
	}
	if len(want) > 0 {
		t.Errorf("Secrets missing: %v", slices.Sorted(maps.Keys(want)))
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
