// Package certs holds the mutual TLS between the CCM and the agents: creating a CA and the
// certificates it signs (for `metalvipctl certs`), and the TLS configurations that check them.
//
// Identities: the CCM's client certificate names "metalvip-cloud-controller-manager"; a
// viewer's (metalvipctl agent, people) names "metalvip-viewer"; each agent's server
// certificate names its node: as a DNS name, or as an IP address when the node is named by one
// (kubelet's --hostname-override=<ip>). An agent serves only clients whose certificate chains to the CA
// and names the CCM or the viewer, and lets the viewer only read (the agent's interceptor
// checks the role per call); the CCM accepts an agent only if its certificate chains to the
// CA and names the node it dialled.
package certs

import (
	"crypto"
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
	"net"
	"net/netip"
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

func (u Usage) extKeyUsage() x509.ExtKeyUsage {
	if u == Client {
		return x509.ExtKeyUsageClientAuth
	}
	return x509.ExtKeyUsageServerAuth
}

// ErrName is a name no certificate can hold as exactly that name.
var ErrName = errors.New("not a name a certificate can hold")

// SubjectAltNames is where a certificate holds name: an IP address SAN when name is an IP
// address, a DNS SAN otherwise. Go's verifier (like every TLS client) checks a name that
// parses as an IP address against the IP SANs alone, so a node named by its address with only
// a DNS SAN never verifies. An address is taken only in its canonical form: "2001:0db8::20",
// "::ffff:198.51.100.20" or a zone would hold the same SAN as another name, and let that
// node's certificate speak for this one.
func SubjectAltNames(name string) (dns []string, ips []net.IP, err error) {
	addr, perr := netip.ParseAddr(name)
	if perr != nil {
		return []string{name}, nil, nil
	}
	if canon := addr.Unmap().WithZone(""); canon.String() != name {
		return nil, nil, fmt.Errorf("%w: %q is the IP address %s written otherwise (a zone, IPv4-mapped or not canonical); name the node %s", ErrName, name, canon, canon)
	}
	return nil, []net.IP{addr.AsSlice()}, nil
}

// Issue signs a certificate for name (as common name, and as DNS name or IP address: see
// SubjectAltNames) with ca, for a new key.
func Issue(ca Pair, name string, usage Usage, validity time.Duration) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	cert, err := IssueFor(ca, &key.PublicKey, name, usage, validity)
	if err != nil {
		return Pair{}, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{Cert: cert, Key: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})}, nil
}

// IssueFor signs a certificate (PEM) for name and the public key pub with ca: what an agent's
// enrollment needs, whose key never leaves its node.
func IssueFor(ca Pair, pub crypto.PublicKey, name string, usage Usage, validity time.Duration) ([]byte, error) {
	dns, ips, err := SubjectAltNames(name)
	if err != nil {
		return nil, err
	}
	caCert, caKey, err := parsePair(ca)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     dns,
		IPAddresses:  ips,
		// A little back-dated, for clocks a little behind.
		NotBefore:   now.Add(-min(time.Hour, validity/10)),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage.extKeyUsage()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
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

// Source gives one side's certificate and the CA pool its peer must chain to. Both are asked
// at every handshake, so that a certificate renewed or a CA file changed is used at once,
// without a restart; connections already open are not touched.
type Source interface {
	Certificate() (*tls.Certificate, error)
	Pool() (*x509.CertPool, error)
}

// FileSource reads a Source from PEM files, and again when they change.
func FileSource(f Files) (Source, error) {
	l := &loader{files: f}
	if _, _, err := l.load(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *loader) Certificate() (*tls.Certificate, error) {
	c, _, err := l.load()
	return c, err
}

func (l *loader) Pool() (*x509.CertPool, error) {
	_, p, err := l.load()
	return p, err
}

// ServerConfig is the agent's TLS: its own certificate, and only clients whose certificate
// chains to the CA and names one of allowed (client usage).
func ServerConfig(f Files, allowed ...string) (*tls.Config, error) {
	src, err := FileSource(f)
	if err != nil {
		return nil, err
	}
	return ServerConfigFrom(src, allowed...)
}

// ServerConfigFrom is ServerConfig with the certificate and the CA from src.
func ServerConfigFrom(src Source, allowed ...string) (*tls.Config, error) {
	if len(allowed) == 0 {
		return nil, errors.New("no client identity allowed")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, err := src.Certificate()
			if err != nil {
				return nil, err
			}
			pool, err := src.Pool()
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
	src, err := FileSource(f)
	if err != nil {
		return nil, err
	}
	return ClientConfigFrom(src, node), nil
}

// ClientConfigFrom is ClientConfig with the certificate and the CA from src. The server's
// chain is checked against the pool src gives at the handshake, not one taken once.
func ClientConfigFrom(src Source, node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: node,
		// Checked below, against the pool of the moment (crypto/tls can take only a fixed one).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyServer(cs, src, node)
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.Certificate()
		},
	}
}

// VerifyServer checks that the server's certificate chains to src's CA, names node and is for
// server usage.
func VerifyServer(cs tls.ConnectionState, src Source, node string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server gave no certificate")
	}
	pool, err := src.Pool()
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	return Verify(cs.PeerCertificates[0], pool, inter, node, Server)
}

// Verify checks that leaf chains to roots (through inter, which may be nil), is for usage and
// names name where Issue writes it (SubjectAltNames): the one check of a certificate against
// the node it must be for.
func Verify(leaf *x509.Certificate, roots, inter *x509.CertPool, name string, usage Usage) error {
	if _, _, err := SubjectAltNames(name); err != nil {
		return err
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{usage.extKeyUsage()},
	})
	return err
}

// Identity returns which of want the peer's certificate (already verified against the CA)
// names, by common name or where Issue writes it (a DNS name, or an IP address in its
// canonical form: see SubjectAltNames).
func Identity(cs tls.ConnectionState, want ...string) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	for _, w := range want {
		if leaf.Subject.CommonName == w || slices.Contains(leaf.DNSNames, w) || slices.ContainsFunc(leaf.IPAddresses, func(ip net.IP) bool {
			a, ok := netip.AddrFromSlice(ip)
			return ok && a.Unmap().String() == w
		}) {
			return w, nil
		}
	}
	return "", fmt.Errorf("client certificate names %q, none of %q", leaf.Subject.CommonName, want)
}

// PoolFile is a CA bundle read from a PEM file, and again when the file changes (a ConfigMap
// updated in place).
type PoolFile struct {
	path string
	mu   sync.Mutex
	mod  time.Time
	pool *x509.CertPool
}

// NewPoolFile reads the CA bundle at path.
func NewPoolFile(path string) (*PoolFile, error) {
	p := &PoolFile{path: path}
	if _, err := p.Pool(); err != nil {
		return nil, err
	}
	return p, nil
}

// Pool returns the bundle as the file holds it now; when the file cannot be read any more,
// the last good one.
func (p *PoolFile) Pool() (*x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, err := os.Stat(p.path)
	if err != nil {
		if p.pool != nil {
			return p.pool, nil
		}
		return nil, err
	}
	if p.pool != nil && !st.ModTime().After(p.mod) {
		return p.pool, nil
	}
	data, err := os.ReadFile(p.path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		if p.pool != nil {
			return p.pool, nil
		}
		return nil, fmt.Errorf("%s holds no PEM certificate", p.path)
	}
	p.pool, p.mod = pool, st.ModTime()
	return pool, nil
}
