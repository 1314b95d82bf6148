// Package pki is the one place test code writes certificates and keys: the agents' gRPC PKI
// (a CA, the CCM's and the viewer's client pairs, a server pair per node), a Kubernetes API
// server's serving pair, service-account keys and an admin token file. Files are PEM, mode
// 0600, named NAME.crt and NAME.key as metalvipctl certs names them. It only writes: loading
// and verifying are internal/certs's, as in production.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/test/testenv"
)

// WritePair writes p into dir as name.crt and, when p has a key, name.key.
func WritePair(dir, name string, p certs.Pair) error {
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), p.Cert, 0o600); err != nil {
		return err
	}
	if p.Key == nil {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), p.Key, 0o600)
}

// Agents writes the agents' gRPC PKI into dir, every file name after prefix: a CA (ca), the
// CCM's client pair (ccm), the viewer's (viewer), and a server pair per node (named after it),
// valid for validity. It returns the CA.
func Agents(dir, prefix string, validity time.Duration, nodes ...string) (certs.Pair, error) {
	ca, err := certs.NewCA("metalvip-ca", validity)
	if err != nil {
		return certs.Pair{}, err
	}
	if err := WritePair(dir, prefix+"ca", ca); err != nil {
		return certs.Pair{}, err
	}
	issue := func(file, name string, usage certs.Usage) error {
		return Issue(dir, prefix+file, ca, name, usage, validity)
	}
	if err := issue("ccm", certs.CCMName, certs.Client); err != nil {
		return certs.Pair{}, err
	}
	if err := issue("viewer", certs.ViewerName, certs.Client); err != nil {
		return certs.Pair{}, err
	}
	for _, n := range nodes {
		if err := issue(n, n, certs.Server); err != nil {
			return certs.Pair{}, err
		}
	}
	return ca, nil
}

// Issue signs a pair for name with ca and writes it into dir as file.crt and file.key.
func Issue(dir, file string, ca certs.Pair, name string, usage certs.Usage, validity time.Duration) error {
	p, err := certs.Issue(ca, name, usage, validity)
	if err != nil {
		return fmt.Errorf("issue %s: %w", name, err)
	}
	return WritePair(dir, file, p)
}

// ClientCA writes a new CA's certificate alone (client-ca.crt) into dir: what kube-apiserver's
// --client-ca-file needs for it to publish extension-apiserver-authentication, which a CCM's
// secure port reads.
func ClientCA(dir string, validity time.Duration) error {
	ca, err := certs.NewCA("client-ca", validity)
	if err != nil {
		return err
	}
	return WritePair(dir, "client-ca", certs.Pair{Cert: ca.Cert})
}

// AgentsDir writes the agents' gRPC PKI (see Agents), valid for an hour, into a new folder of
// t's and returns it.
func AgentsDir(t testenv.TB, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := Agents(dir, "", time.Hour, nodes...); err != nil {
		t.Fatalf("agents' PKI: %v", err)
	}
	return dir
}

// Files are the agents' PKI files in dir as the CCM (or a node, for name) loads them.
func Files(dir, name string) certs.Files {
	return certs.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
}

// CCMConfig is the TLS settings of a CCM cloud-config's agent section for the agents' PKI in
// dir (caFile, certFile, keyFile: the CCM's files), a line each, the lines after the first
// indented as the section's keys.
func CCMConfig(dir string) string {
	f := Files(dir, "ccm")
	return fmt.Sprintf("caFile: %s\n  certFile: %s\n  keyFile: %s", f.CA, f.Cert, f.Key)
}

// APIServer writes a Kubernetes CA (ca.crt) and a kube-apiserver serving pair signed by it
// (apiserver.crt, apiserver.key) for the DNS name kubernetes and addrs into dir.
func APIServer(dir string, validity time.Duration, addrs ...netip.Addr) error {
	ca, err := certs.NewCA("lab-kubernetes-ca", validity)
	if err != nil {
		return err
	}
	caBlock, _ := pem.Decode(ca.Cert)
	keyBlock, _ := pem.Decode(ca.Key)
	if caBlock == nil || keyBlock == nil {
		return fmt.Errorf("the Kubernetes CA is not PEM")
	}
	caCert, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return err
	}
	caKey, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	var ips []net.IP
	for _, a := range addrs {
		ips = append(ips, a.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity), IPAddresses: ips, DNSNames: []string{"kubernetes"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := WritePair(dir, "ca", certs.Pair{Cert: ca.Cert}); err != nil {
		return err
	}
	return WritePair(dir, "apiserver", certs.Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	})
}

// ServiceAccount writes a new service-account signing key (sa.key) and its public key (sa.pub)
// into dir, for kube-apiserver's --service-account-signing-key-file and -key-file.
func ServiceAccount(dir string) (*rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// AdminToken writes a token file (tokens.csv, for kube-apiserver's --token-auth-file) with one
// new random token for user in system:masters, and returns the token.
func AdminToken(dir, user string) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	line := fmt.Sprintf("%s,%s,%s,system:masters\n", token, user, user)
	return token, os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600)
}
