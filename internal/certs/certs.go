// Package certs holds the mutual TLS between the CCM and the agents: creating a CA and the
// certificates it signs (for `metalvipctl certs`), and the TLS configurations that check them.
//
// Identities: the CCM's client certificate names "metalvip-cloud-controller-manager"; a
// viewer's (metalvipctl agent, people) names "metalvip-viewer"; each agent's server
// certificate names its node. An agent serves only clients whose certificate chains to the CA
// and names the CCM or the viewer, and lets the viewer only read (the agent's interceptor
// checks the role per call); the CCM accepts an agent only if its certificate chains to the
// CA and names the node it dialled.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"sync"
	"time"
)

// CCMName is the identity in the CCM's client certificate.
const CCMName = "metalvip-cloud-controller-manager"

// ViewerName is the identity in a viewer's client certificate: it may read an agent's state
// and events, never change them. Issue one with Issue(ca, ViewerName, Client, validity).
const ViewerName = "metalvip-viewer"

// Pair is a PEM certificate and its PEM key.
type Pair struct {
	Cert, Key []byte
}

// NewCA creates a self-signed CA.
func NewCA(name string, validity time.Duration) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Pair{}, err
	}
	return encode(der, key)
}

// Usage is what a certificate is for.
type Usage int

// Usages.
const (
	Server Usage = iota // an agent: TLS server
	Client              // the CCM: TLS client
)

// Issue signs a certificate for name (as common name and DNS name) with ca.
func Issue(ca Pair, name string, usage Usage, validity time.Duration) (Pair, error) {
	caCert, caKey, err := parsePair(ca)
	if err != nil {
		return Pair{}, fmt.Errorf("CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	eku := x509.ExtKeyUsageServerAuth
	if usage == Client {
		eku = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{eku},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return Pair{}, err
	}
	return encode(der, key)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

func encode(der []byte, key *ecdsa.PrivateKey) (Pair, error) {
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}),
	}, nil
}

func parsePair(p Pair) (*x509.Certificate, any, error) {
	tc, err := tls.X509KeyPair(p.Cert, p.Key)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(tc.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	return c, tc.PrivateKey, nil
}

// Files names the PEM files of one side of the connection.
type Files struct {
	CA, Cert, Key string
}

// loader reads a key pair from files and reads it again when they change, so that rotated
// certificates (a Secret updated in place) are used without a restart.
type loader struct {
	files Files
	mu    sync.Mutex
	mod   time.Time
	cert  *tls.Certificate
	pool  *x509.CertPool
}

func (l *loader) load() (*tls.Certificate, *x509.CertPool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var newest time.Time
	for _, f := range []string{l.files.CA, l.files.Cert, l.files.Key} {
		st, err := os.Stat(f)
		if err != nil {
			return nil, nil, err
		}
		if st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	if l.cert != nil && !newest.After(l.mod) {
		return l.cert, l.pool, nil
	}
	pair, err := tls.LoadX509KeyPair(l.files.Cert, l.files.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s and %s: %w", l.files.Cert, l.files.Key, err)
	}
	caPEM, err := os.ReadFile(l.files.CA)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%s holds no PEM certificate", l.files.CA)
	}
	l.cert, l.pool, l.mod = &pair, pool, newest
	return l.cert, l.pool, nil
}

// ServerConfig is the agent's TLS: its own certificate, and only clients whose certificate
// chains to the CA and names one of allowed (client usage).
func ServerConfig(f Files, allowed ...string) (*tls.Config, error) {
	if len(allowed) == 0 {
		return nil, errors.New("no client identity allowed")
	}
	l := &loader{files: f}
	if _, _, err := l.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool, err := l.load()
			if err != nil {
				return nil, err
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pool,
				VerifyConnection: func(cs tls.ConnectionState) error {
					_, err := Identity(cs, allowed...)
					return err
				},
			}, nil
		},
	}, nil
}

// ClientConfig is the CCM's TLS towards the agent of node: its own certificate, and only a
// server whose certificate chains to the CA and names node.
func ClientConfig(f Files, node string) (*tls.Config, error) {
	l := &loader{files: f}
	if _, _, err := l.load(); err != nil {
		return nil, err
	}
	_, pool, _ := l.load()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: node,
		RootCAs:    pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _, err := l.load()
			return c, err
		},
	}, nil
}

// Identity returns which of want the peer's certificate (already verified against the CA)
// names, by common name or DNS name.
func Identity(cs tls.ConnectionState, want ...string) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	for _, w := range want {
		if leaf.Subject.CommonName == w || slices.Contains(leaf.DNSNames, w) {
			return w, nil
		}
	}
	return "", fmt.Errorf("client certificate names %q, none of %q", leaf.Subject.CommonName, want)
}
