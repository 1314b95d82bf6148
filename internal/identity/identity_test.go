package identity

import (
	"bytes"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"

	authenticationv1 "k8s.io/api/authentication/v1"
	"pgregory.net/rapid"

	"github.com/metalvip/metalvip/internal/certs"
)

func validStatus(node string) authenticationv1.TokenReviewStatus {
	return authenticationv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     []string{Audience},
		User: authenticationv1.UserInfo{
			Username: "system:serviceaccount:kube-system:metalvip-agent",
			Extra: map[string]authenticationv1.ExtraValue{
				PodNameExtra:  {"metalvip-agent-x1"},
				NodeNameExtra: {node},
			},
		},
	}
}

func TestCheckDecidesEachClaim(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*authenticationv1.TokenReviewStatus)
		want   string // "" accepts
	}{
		{"a token of the agents' ServiceAccount bound to a Pod on the node is accepted", func(*authenticationv1.TokenReviewStatus) {}, ""},
		{"a token the API server did not authenticate is refused with its reason", func(s *authenticationv1.TokenReviewStatus) {
			s.Authenticated, s.Error = false, "token has expired"
		}, "token has expired"},
		{"a token for another audience is refused", func(s *authenticationv1.TokenReviewStatus) { s.Audiences = []string{"https://kubernetes.default.svc"} }, "is for"},
		{"a token of another ServiceAccount is refused", func(s *authenticationv1.TokenReviewStatus) {
			s.User.Username = "system:serviceaccount:kube-system:default"
		}, "not the agents' ServiceAccount"},
		{"a token of the agents' ServiceAccount in another namespace is refused", func(s *authenticationv1.TokenReviewStatus) {
			s.User.Username = "system:serviceaccount:default:metalvip-agent"
		}, "not the agents' ServiceAccount"},
		{"a token bound to no Pod is refused", func(s *authenticationv1.TokenReviewStatus) { delete(s.User.Extra, PodNameExtra) }, "bound to no Pod"},
		{"a token naming no Node is refused", func(s *authenticationv1.TokenReviewStatus) { delete(s.User.Extra, NodeNameExtra) }, "names no Node"},
		{"a token of a Pod on another node is refused", func(s *authenticationv1.TokenReviewStatus) {
			s.User.Extra[NodeNameExtra] = authenticationv1.ExtraValue{"node-2"}
		}, "on node-2"},
		{"a token naming two Nodes is refused", func(s *authenticationv1.TokenReviewStatus) {
			s.User.Extra[NodeNameExtra] = authenticationv1.ExtraValue{"node-1", "node-2"}
		}, "names no Node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := validStatus("node-1")
			tc.change(&st)
			err := Check(st, "node-1", "kube-system", "metalvip-agent")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check = %v; want accepted", err)
			case tc.want != "" && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Check = %v; want a refusal saying %q", err, tc.want)
			}
		})
	}
}

// TestCheckAcceptsOnlyTheDialledNode: whatever node a token names, it enrolls only the agent
// dialled as that node.
func TestCheckAcceptsOnlyTheDialledNode(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name := rapid.StringMatching(`[a-z][a-z0-9-]{0,20}[a-z0-9]`)
		claimed, dialled := name.Draw(t, "claimed"), name.Draw(t, "dialled")
		err := Check(validStatus(claimed), dialled, "kube-system", "metalvip-agent")
		if (err == nil) != (claimed == dialled) {
			t.Fatalf("token of a Pod on %q, agent dialled as %q: Check = %v", claimed, dialled, err)
		}
	})
}

type pki struct {
	ca     certs.Pair
	caFile string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	ca, err := certs.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, ca.Cert, 0o600); err != nil {
		t.Fatal(err)
	}
	return pki{ca: ca, caFile: f}
}

func newEnrollee(t *testing.T, p pki, node, dir string) *Enrollee {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("a-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := NewEnrollee(EnrolleeOptions{Node: node, CAFile: p.caFile, TokenFile: tok, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sign(t *testing.T, ca certs.Pair, req Request, name string, validity time.Duration) []byte {
	t.Helper()
	csr, err := x509.ParseCertificateRequest(req.CertificateRequest)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := certs.IssueFor(ca, csr.PublicKey, name, certs.Server, validity)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestInstallTakesOnlyACertificateForItsKeyNodeAndCA(t *testing.T) {
	p := newPKI(t)
	other := newPKI(t)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		name string
		cert func(req Request) []byte
		want string // "" installs
	}{
		{"a certificate of the CA for the node and the key of the last Enroll is installed", func(r Request) []byte { return sign(t, p.ca, r, "node-1", time.Hour) }, ""},
		{"a certificate for another node is refused", func(r Request) []byte { return sign(t, p.ca, r, "node-2", time.Hour) }, "not valid for node node-1"},
		{"a certificate of another CA is refused", func(r Request) []byte { return sign(t, other.ca, r, "node-1", time.Hour) }, "not valid for node node-1"},
		{"a certificate for another key is refused", func(Request) []byte {
			c, _ := certs.IssueFor(p.ca, &otherKey.PublicKey, "node-1", certs.Server, time.Hour)
			return c
		}, "not for the key"},
		{"an expired certificate is refused", func(r Request) []byte { return sign(t, p.ca, r, "node-1", -time.Minute) }, "not valid"},
		{"garbage is refused", func(Request) []byte { return []byte("not a certificate") }, "not for the key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			e := newEnrollee(t, p, "node-1", dir)
			req, err := e.Enroll()
			if err != nil {
				t.Fatal(err)
			}
			if req.Token != "a-token" || req.Node != "node-1" {
				t.Fatalf("Enroll = node %q token %q", req.Node, req.Token)
			}
			err = e.Install(tc.cert(req))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || e.Enrolled() {
					t.Errorf("Install = %v, enrolled %v; want a refusal saying %q", err, e.Enrolled(), tc.want)
				}
				if _, serr := os.Stat(filepath.Join(dir, certFile)); serr == nil {
					t.Error("a refused certificate was kept")
				}
				return
			}
			if err != nil || !e.Enrolled() {
				t.Fatalf("Install = %v, enrolled %v", err, e.Enrolled())
			}
			// A restart serves the kept certificate at once.
			again := newEnrollee(t, p, "node-1", dir)
			c, _ := again.Certificate()
			if !again.Enrolled() || c.Leaf.Subject.CommonName != "node-1" {
				t.Errorf("after a restart: enrolled %v, serving %q", again.Enrolled(), c.Leaf.Subject.CommonName)
			}
		})
	}
}

func TestAKeptCertificateIsUsedOnlyForItsNodeAndCA(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	e := newEnrollee(t, p, "node-1", dir)
	req, _ := e.Enroll()
	if err := e.Install(sign(t, p.ca, req, "node-1", time.Hour)); err != nil {
		t.Fatal(err)
	}
	t.Run("another node's agent on the same folder does not serve it", func(t *testing.T) {
		if newEnrollee(t, p, "node-2", dir).Enrolled() {
			t.Error("node-2 serves node-1's kept certificate")
		}
	})
	t.Run("after the CA changed it is not served", func(t *testing.T) {
		if newEnrollee(t, newPKI(t), "node-1", dir).Enrolled() {
			t.Error("a certificate of the old CA is served")
		}
	})
	t.Run("a key that does not match the certificate is not served", func(t *testing.T) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		kd, _ := x509.MarshalECPrivateKey(k)
		if err := os.WriteFile(filepath.Join(dir, keyFile), pemKey(kd), 0o600); err != nil {
			t.Fatal(err)
		}
		if newEnrollee(t, p, "node-1", dir).Enrolled() {
			t.Error("a mismatched pair is served")
		}
	})
}

func TestUntilEnrolledTheAgentServesACertificateNobodyTrusts(t *testing.T) {
	p := newPKI(t)
	e := newEnrollee(t, p, "node-1", t.TempDir())
	c, err := e.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := e.Pool()
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "node-1"}); err == nil {
		t.Error("the bootstrap certificate verifies against the CA")
	}
	if e.Enrolled() {
		t.Error("enrolled before any Install")
	}
	if err := e.Install(nil); err == nil {
		t.Error("Install without Enroll accepted")
	}
}

func pemKey(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// Issue 30, fault 9: anyone who may write the ConfigMap metalvip-ca could add a CA of their
// own to the bundle the agents mount, and its client certificates (the CCM's name, the
// viewer's) were trusted. An enrolled agent trusts, of the bundle, only the CA that signed its
// own certificate; once the CA is replaced (its certificate no longer valid), the whole bundle
// again, so that it can be enrolled anew.
func TestAnEnrolledAgentTrustsOnlyTheCAThatSignedIt(t *testing.T) {
	p, rogue := newPKI(t), newPKI(t)
	e := newEnrollee(t, p, "node-1", t.TempDir())
	client := func(ca certs.Pair) *x509.Certificate {
		t.Helper()
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, err := certs.IssueFor(ca, &k.PublicKey, certs.CCMName, certs.Client, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(der)
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	trusts := func(c *x509.Certificate) bool {
		t.Helper()
		pool, err := e.Pool()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	writes := 0
	bundle := func(pems ...[]byte) {
		t.Helper()
		writes++
		// A later modification time: the bundle is read again.
		if err := os.WriteFile(p.caFile, bytes.Join(pems, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Duration(writes) * time.Second)
		if err := os.Chtimes(p.caFile, later, later); err != nil {
			t.Fatal(err)
		}
	}
	ours, theirs := client(p.ca), client(rogue.ca)
	bundle(p.ca.Cert, rogue.ca.Cert)
	if !trusts(ours) || !trusts(theirs) {
		t.Fatal("not enrolled, the agent trusts the whole bundle: the first enrollment needs it")
	}
	req, err := e.Enroll()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Install(sign(t, p.ca, req, "node-1", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !trusts(ours) || trusts(theirs) {
		t.Errorf("enrolled by the CA: trusts its CCM %v (want true), a CA added to the bundle %v (want false)", trusts(ours), trusts(theirs))
	}
	bundle(rogue.ca.Cert) // the CA replaced: the agent's certificate is no longer valid
	if e.Enrolled() || !trusts(theirs) {
		t.Errorf("after the CA was replaced: enrolled %v, trusts the new CA %v; want not enrolled, trusting it (to be enrolled anew)", e.Enrolled(), trusts(theirs))
	}
}
