package identity

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
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/atomicfile"
	"github.com/metalvip/metalvip/internal/certs"
)

// EnrolleeOptions shape an agent's side of enrollment.
type EnrolleeOptions struct {
	// Node is the node the agent runs on.
	Node string
	// CAFile is the CA bundle the CCM publishes (the ConfigMap metalvip-ca, mounted): the CCM
	// is authenticated against it even before this agent is enrolled.
	CAFile string
	// TokenFile is the projected ServiceAccount token (kubelet rotates it in place).
	TokenFile string
	// Dir keeps the certificate and its key (the agent's state folder, on the node's disk):
	// an agent restarted while the CCM is away is enrolled at once.
	Dir string
}

// Files in Dir.
const (
	certFile = "identity.crt"
	keyFile  = "identity.key"
)

// ErrNotEnrolled is the answer to every call but Enroll and Install while the agent holds no
// valid certificate.
var ErrNotEnrolled = errors.New("this agent is not enrolled yet: it holds no valid certificate for its node; the CCM enrolls it when it reaches it (docs/agent-tls.md)")

// Enrollee is the agent's side of enrollment. It is the agent's certs.Source: until enrolled
// it serves a temporary self-signed certificate that nobody trusts, and then the one the CCM
// signed; clients are checked against the CA bundle at every handshake.
type Enrollee struct {
	opts      EnrolleeOptions
	ca        *certs.PoolFile
	bootstrap *tls.Certificate

	mu      sync.Mutex
	cert    *tls.Certificate  // the CCM's; nil: none yet
	pending *ecdsa.PrivateKey // the key of the last Enroll answer
	pin     pinned            // Pool's last answer
}

var _ certs.Source = (*Enrollee)(nil)

// NewEnrollee reads the CA bundle (it must exist: kubelet starts the agent only once the
// ConfigMap does) and the certificate kept in Dir, if it is still valid for this node and
// this CA.
func NewEnrollee(opts EnrolleeOptions) (*Enrollee, error) {
	// A name no certificate can hold would be enrolled again and again, never valid.
	if _, _, err := certs.SubjectAltNames(opts.Node); err != nil {
		return nil, fmt.Errorf("node %s: %w", opts.Node, err)
	}
	ca, err := certs.NewPoolFile(opts.CAFile)
	if err != nil {
		return nil, fmt.Errorf("the CA bundle: %w (the CCM publishes it in the ConfigMap %s at its start)", err, CAName)
	}
	boot, err := selfSigned(opts.Node)
	if err != nil {
		return nil, err
	}
	e := &Enrollee{opts: opts, ca: ca, bootstrap: boot}
	if c, err := tls.LoadX509KeyPair(filepath.Join(opts.Dir, certFile), filepath.Join(opts.Dir, keyFile)); err == nil {
		if err := e.valid(&c); err == nil {
			e.cert = &c
			klog.InfoS("Serving with the certificate kept from the last enrollment", "node", opts.Node, "notAfter", c.Leaf.NotAfter)
		} else {
			klog.InfoS("The certificate kept from the last enrollment is not used; waiting for the CCM to enroll this agent", "node", opts.Node, "reason", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		klog.InfoS("The certificate kept from the last enrollment cannot be read; waiting for the CCM to enroll this agent", "node", opts.Node, "reason", err)
	}
	return e, nil
}

// valid checks that c names this node, chains to the CA bundle of the moment and is valid now.
func (e *Enrollee) valid(c *tls.Certificate) error {
	pool, err := e.ca.Pool()
	if err != nil {
		return err
	}
	return certs.Verify(c.Leaf, pool, nil, e.opts.Node, certs.Server)
}

// Enrolled reports whether the agent holds a valid certificate for its node.
func (e *Enrollee) Enrolled() bool {
	e.mu.Lock()
	c := e.cert
	e.mu.Unlock()
	return c != nil && e.valid(c) == nil
}

// Certificate is the certificate to serve now.
func (e *Enrollee) Certificate() (*tls.Certificate, error) {
	e.mu.Lock()
	c := e.cert
	e.mu.Unlock()
	if c != nil && e.valid(c) == nil {
		return c, nil
	}
	return e.bootstrap, nil
}

// Pool is what clients are checked against. Enrolled, it is the one CA of the bundle that
// signed this agent's own certificate: a CA added to the bundle later (anyone who may write
// the ConfigMap metalvip-ca could add one, issue 30 fault 9) signs no client this agent
// trusts, as long as its own certificate stays valid. Not enrolled (or its certificate no
// longer valid under the bundle: the CA was replaced), it is the whole bundle, which the first
// enrollment must trust.
func (e *Enrollee) Pool() (*x509.CertPool, error) {
	bundle, err := e.ca.Pool()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	c := e.cert
	if e.pin.bundle == bundle && e.pin.cert == c && e.pin.pool != nil {
		p := e.pin.pool
		e.mu.Unlock()
		return p, nil
	}
	e.mu.Unlock()
	if c == nil {
		return bundle, nil
	}
	chains, err := c.Leaf.Verify(x509.VerifyOptions{Roots: bundle, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil || len(chains) == 0 {
		return bundle, nil // invalid under the bundle: the agent is enrolled again
	}
	issuer := x509.NewCertPool()
	issuer.AddCert(chains[0][len(chains[0])-1])
	e.mu.Lock()
	if e.cert == c {
		e.pin = pinned{bundle: bundle, cert: c, pool: issuer}
	}
	e.mu.Unlock()
	return issuer, nil
}

// pinned is the pool Pool gave for a bundle and a certificate.
type pinned struct {
	bundle *x509.CertPool
	cert   *tls.Certificate
	pool   *x509.CertPool
}

// Request is an Enroll answer.
type Request struct {
	Node               string
	CertificateRequest []byte // DER
	Token              string
}

// Enroll makes a new key and returns a request for it with the agent's token. The key stays
// in memory until Install brings its certificate; another Enroll replaces it.
func (e *Enrollee) Enroll() (Request, error) {
	token, err := readToken(e.opts.TokenFile)
	if err != nil {
		return Request{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Request{}, err
	}
	// The CCM takes only the key from it; the names say what it is for, to a person reading it.
	dns, ips, err := certs.SubjectAltNames(e.opts.Node)
	if err != nil {
		return Request{}, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: e.opts.Node}, DNSNames: dns, IPAddresses: ips,
	}, key)
	if err != nil {
		return Request{}, err
	}
	e.mu.Lock()
	e.pending = key
	e.mu.Unlock()
	return Request{Node: e.opts.Node, CertificateRequest: der, Token: token}, nil
}

func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("the ServiceAccount token: %w (mount the projected token volume, docs/agent-tls.md)", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenBytes+1))
	if err != nil {
		return "", fmt.Errorf("the ServiceAccount token %s: %w", path, err)
	}
	if len(data) > MaxTokenBytes {
		return "", fmt.Errorf("the ServiceAccount token %s is over %d bytes", path, MaxTokenBytes)
	}
	return strings.TrimSpace(string(data)), nil
}

// Install takes the certificate (PEM) signed for the key of the last Enroll, checks it, keeps
// it in Dir and serves it from the next handshake on.
func (e *Enrollee) Install(certPEM []byte) error {
	e.mu.Lock()
	key := e.pending
	e.mu.Unlock()
	if key == nil {
		return errors.New("no enrollment is under way: call Enroll first")
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the certificate is not for the key of the last Enroll: %w", err)
	}
	if err := e.valid(&c); err != nil {
		return fmt.Errorf("the certificate is not valid for node %s under the CA bundle %s: %w", e.opts.Node, e.opts.CAFile, err)
	}
	// The key first: a crash between the two leaves a pair that does not match, read as none.
	if err := atomicfile.Write(e.opts.Dir, keyFile, keyPEM); err != nil {
		return fmt.Errorf("keep the key: %w", err)
	}
	if err := atomicfile.Write(e.opts.Dir, certFile, certPEM); err != nil {
		return fmt.Errorf("keep the certificate: %w", err)
	}
	e.mu.Lock()
	if e.pending == key {
		e.pending = nil
	}
	e.cert = &c
	e.mu.Unlock()
	klog.InfoS("Enrolled: serving with a certificate for this node", "node", e.opts.Node, "notAfter", c.Leaf.NotAfter, "serial", c.Leaf.SerialNumber.Text(16))
	return nil
}

// selfSigned is the certificate an agent serves before it is enrolled: the CCM does not check
// it (it sends nothing secret on such a connection: it only asks for a token), and nothing
// else trusts it.
func selfSigned(node string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "metalvip-agent-not-enrolled." + node},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
