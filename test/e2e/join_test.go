package e2e

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/pki"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestAFourthNodeJoinsWithNoManualStep: a running cluster of three enrolled nodes; a fourth
// joins as a new node does (its Node, its agent Pod and projected token, its agent: no
// certificate made for it) and is enrolled by the CCM, advertises the Cluster-policy BGP VIP
// and takes the next L2 VIP. Afterwards no Secret of the cluster holds any node's private key.
func TestAFourthNodeJoinsWithNoManualStep(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, Nodes: 4, Joined: 3})
	bgp := c.Service("everywhere", cluster.InPool("bgp-"+c.NS))
	three := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	harness.Eventually(t, 60*time.Second, "the BGP VIP is advertised by the three nodes", func() bool {
		return slices.Equal(c.NextHops(bgp), three)
	})
	var l2 []netip.Addr
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		l2 = append(l2, c.Service(name))
	}
	harness.Eventually(t, 30*time.Second, "the three L2 VIPs are answered, one per node", func() bool {
		owners := cluster.ValuesOf(c.Owners(l2))
		slices.Sort(owners)
		return slices.Equal(owners, []string{"node1", "node2", "node3"})
	})

	joined := time.Now()
	c.Join("node4")
	took := harness.Eventually(t, 60*time.Second, "the joined node advertises the BGP VIP", func() bool {
		return slices.Equal(c.NextHops(bgp), append(slices.Clone(three), "198.51.100.14"))
	})
	t.Logf("node4 advertises the BGP VIP %s after joining", took.Round(time.Millisecond))
	next := c.Service("web-4")
	c.WaitOwner(next, "node4", 30*time.Second)
	t.Logf("node4 answers a new L2 VIP %s after joining", time.Since(joined).Round(time.Millisecond))

	t.Run("every agent serves a certificate for its node alone", func(t *testing.T) {
		for _, h := range c.Lab.Nodes {
			cert := servedCertificate(t, c, h.Name)
			if cert.Subject.CommonName != h.Name || !slices.Equal(cert.DNSNames, []string{h.Name}) {
				t.Errorf("%s's agent serves a certificate for CN %q DNS %v", h.Name, cert.Subject.CommonName, cert.DNSNames)
			}
		}
	})
	t.Run("metalvipctl agent looks at a joined agent with a viewer's certificate the CCM signed", func(t *testing.T) {
		h := c.Agents["node4"].Host
		out, err := c.Lab.Control.Run(t.Context(), ctlBinary, "agent", "node4", "--kubeconfig", c.Kubeconfig(),
			"--address", h.IPv4.String(), "--ca-namespace", c.NS)
		if err != nil || !strings.Contains(string(out), next.String()) {
			t.Errorf("metalvipctl agent node4 = %v; want its state naming %s:\n%s", err, next, out)
		}
	})
	t.Run("no Secret holds a node's private key", func(t *testing.T) {
		nodeKeys := map[string]crypto.PublicKey{}
		for _, h := range c.Lab.Nodes {
			nodeKeys[h.Name] = servedCertificate(t, c, h.Name).PublicKey
		}
		secrets, err := c.Srv.Client.CoreV1().Secrets("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var keys int
		for _, s := range secrets.Items {
			for field, data := range s.Data {
				for rest := data; ; {
					var b *pem.Block
					if b, rest = pem.Decode(rest); b == nil {
						break
					}
					pub := publicOf(b)
					if pub == nil {
						continue
					}
					keys++
					for node, nk := range nodeKeys {
						if nk.(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
							t.Errorf("Secret %s/%s (%s) holds the private key of %s", s.Namespace, s.Name, field, node)
						}
					}
				}
			}
		}
		t.Logf("%d Secrets hold %d private keys, none a node's", len(secrets.Items), keys)
	})
}

// servedCertificate is the certificate node's agent serves, checked against the cluster's CA.
func servedCertificate(t *testing.T, c *cluster.Cluster, node string) *x509.Certificate {
	t.Helper()
	a := c.Agents[node]
	src, err := certs.FileSource(pki.Files(c.PKI, "ccm"))
	if err != nil {
		t.Fatal(err)
	}
	var cert *x509.Certificate
	if err := a.Host.Do(func() error {
		conn, err := tls.Dial("tcp", netip.AddrPortFrom(a.Host.IPv4, 7472).String(), certs.ClientConfigFrom(src, node))
		if err != nil {
			return err
		}
		defer conn.Close()
		cert = conn.ConnectionState().PeerCertificates[0]
		return nil
	}); err != nil {
		t.Fatalf("the certificate %s's agent serves: %v", node, err)
	}
	return cert
}

// publicOf is the public key of a PEM private key, nil for anything else.
func publicOf(b *pem.Block) crypto.PublicKey {
	var key any
	var err error
	switch b.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	if s, ok := key.(crypto.Signer); ok {
		return s.Public()
	}
	return nil
}
