// Package identity issues every agent a certificate for its node with no manual step
// (docs/agent-tls.md). The CCM side, Authority, holds the CA (its key in one Secret that only
// the CCM reads, by name), publishes the CA certificate in a ConfigMap the agents mount, issues
// the CCM's own client certificate, and signs a node's certificate only for an agent that
// proves it runs on that node: a projected ServiceAccount token of the agents' ServiceAccount,
// with the agents' audience, bound to a Pod on that Node, checked by a TokenReview. The agent
// side, Enrollee, makes its key, answers the CCM's Enroll with a request and its token, and
// installs what comes back.
//
// It decides who gets a certificate and for which name; it must not touch the wire (the CCM's
// connections to agents are loadbalancer's, the agent's server nodeagent's) and it never
// writes a node's private key anywhere but that node's own state folder.
package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/certs"
)

// Names and figures both sides agree on.
const (
	// Audience is the audience of the agents' projected tokens: a token made for the API
	// server (or any other audience) is refused, and this one is refused by the API server.
	Audience = "metalvip-agent"
	// CAName is the name of the Secret holding the CA (ca.crt, ca.key) and of the ConfigMap
	// publishing its certificate (ca.crt), both in the CCM's namespace.
	CAName = "metalvip-ca"
	// CAKey is the key of the CA certificate in the Secret and the ConfigMap.
	CAKey = "ca.crt"
	// DefaultValidity is how long a node's certificate (and the CCM's) is valid.
	DefaultValidity = 24 * time.Hour
	// caValidity: the CA is made once and kept; rotating it is a manual step
	// (docs/agent-tls.md).
	caValidity = 10 * 365 * 24 * time.Hour
	// MaxTokenBytes and MaxRequestBytes bound what an agent may send (a real token is about
	// 1 KiB, a P-256 request about 250 bytes).
	MaxTokenBytes   = 16 << 10
	MaxRequestBytes = 4 << 10
	// NodeNameExtra is the TokenReview's extra field naming the Node the token's Pod is
	// bound to.
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	// PodNameExtra names the Pod a token is bound to.
	PodNameExtra = "authentication.kubernetes.io/pod-name"
)

// ErrRefused is an enrollment refused: the agent did not prove it runs on the node. The
// wrapping error says why.
var ErrRefused = errors.New("enrollment refused")

// AuthorityOptions shape an Authority.
type AuthorityOptions struct {
	// Namespace holds the CA Secret and ConfigMap and the agents' ServiceAccount.
	Namespace string
	// ServiceAccount is the agents' ServiceAccount (default metalvip-agent).
	ServiceAccount string
	// Validity of the certificates issued (default DefaultValidity).
	Validity time.Duration
}

// Authority is the CCM's side of enrollment. Load it before use.
type Authority struct {
	client kubernetes.Interface
	opts   AuthorityOptions

	mu    sync.Mutex
	ca    certs.Pair
	pool  *x509.CertPool
	ccm   *tls.Certificate // the CCM's client certificate, renewed in memory
	renew time.Time
}

// NewAuthority returns an Authority that reads and writes through client.
func NewAuthority(client kubernetes.Interface, opts AuthorityOptions) *Authority {
	if opts.Namespace == "" {
		opts.Namespace = "kube-system"
	}
	if opts.ServiceAccount == "" {
		opts.ServiceAccount = "metalvip-agent"
	}
	if opts.Validity <= 0 {
		opts.Validity = DefaultValidity
	}
	return &Authority{client: client, opts: opts}
}

// Validity is how long an issued certificate is valid.
func (a *Authority) Validity() time.Duration { return a.opts.Validity }

// Load reads the CA from its Secret, making it when there is none (the first CCM to start; a
// replica that loses the race reads the winner's), and publishes its certificate in the
// ConfigMap. It retries until it succeeds or ctx ends: without the CA no agent can be reached,
// and carrying on without it would leave every node unannounced in silence.
func (a *Authority) Load(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	for {
		err := a.load(ctx)
		if err == nil {
			return nil
		}
		klog.ErrorS(err, "Cannot load the agents' CA; retrying", "namespace", a.opts.Namespace, "secret", CAName, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (a *Authority) load(ctx context.Context) error {
	secrets := a.client.CoreV1().Secrets(a.opts.Namespace)
	s, err := secrets.Get(ctx, CAName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ca, cerr := certs.NewCA("metalvip-agents-ca", caValidity)
		if cerr != nil {
			return cerr
		}
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: CAName, Namespace: a.opts.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "metalvip"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{CAKey: ca.Cert, corev1.TLSCertKey: ca.Cert, corev1.TLSPrivateKeyKey: ca.Key},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, CAName, metav1.GetOptions{})
		}
		if err == nil {
			klog.InfoS("Made the agents' CA", "namespace", a.opts.Namespace, "secret", CAName)
		}
	}
	if err != nil {
		return fmt.Errorf("the CA Secret %s/%s: %w", a.opts.Namespace, CAName, err)
	}
	ca := certs.Pair{Cert: s.Data[corev1.TLSCertKey], Key: s.Data[corev1.TLSPrivateKeyKey]}
	pool := x509.NewCertPool()
	if _, err := tls.X509KeyPair(ca.Cert, ca.Key); err != nil || !pool.AppendCertsFromPEM(ca.Cert) {
		// Fail closed: a CA that does not parse is never replaced behind the operator's back
		// (every agent trusts it); it must be fixed or deleted.
		return fmt.Errorf("the CA Secret %s/%s holds no valid %s and %s (%v); delete it to have a new CA made (every agent then enrolls again)",
			a.opts.Namespace, CAName, corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
	}
	if err := a.publish(ctx, ca.Cert); err != nil {
		return err
	}
	a.mu.Lock()
	a.ca, a.pool = ca, pool
	a.mu.Unlock()
	return nil
}

// publish writes the CA certificate into the ConfigMap the agents mount.
func (a *Authority) publish(ctx context.Context, caPEM []byte) error {
	cms := a.client.CoreV1().ConfigMaps(a.opts.Namespace)
	cm, err := cms.Get(ctx, CAName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: CAName, Namespace: a.opts.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "metalvip"}},
			Data:       map[string]string{CAKey: string(caPEM)},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return a.publish(ctx, caPEM)
		}
	case err == nil && cm.Data[CAKey] != string(caPEM):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[CAKey] = string(caPEM)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publish the CA in the ConfigMap %s/%s: %w", a.opts.Namespace, CAName, err)
	}
	return nil
}

// Pool is the CA the agents' certificates chain to.
func (a *Authority) Pool() (*x509.CertPool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pool == nil {
		return nil, errors.New("the agents' CA is not loaded yet")
	}
	return a.pool, nil
}

// Certificate is the CCM's client certificate, issued by the CA in memory (its key is never
// written anywhere) and issued again when two thirds of its life have passed.
func (a *Authority) Certificate() (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pool == nil {
		return nil, errors.New("the agents' CA is not loaded yet")
	}
	if a.ccm != nil && time.Now().Before(a.renew) {
		return a.ccm, nil
	}
	p, err := certs.Issue(a.ca, certs.CCMName, certs.Client, a.opts.Validity)
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(p.Cert, p.Key)
	if err != nil {
		return nil, err
	}
	a.ccm, a.renew = &c, RenewAt(c.Leaf)
	return a.ccm, nil
}

// RenewAt is when a certificate should be replaced: two thirds into its life, so that a CCM
// away for a while (up to a third of the validity) still finds every agent reachable.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// Sign checks an agent's enrollment for node (its request and token, as its Enroll answer
// gave them) and returns its certificate (PEM), for that node alone and server usage. The
// request's public key is all that is taken from it. A refusal wraps ErrRefused with the
// reason.
func (a *Authority) Sign(ctx context.Context, node string, request []byte, token string) ([]byte, error) {
	// Cheapest first: sizes, then the request's own signature, then the API server.
	switch {
	case len(token) == 0:
		return nil, fmt.Errorf("%w: the agent sent no token (is the projected token volume mounted? docs/agent-tls.md)", ErrRefused)
	case len(token) > MaxTokenBytes:
		return nil, fmt.Errorf("%w: the token is %d bytes, over %d", ErrRefused, len(token), MaxTokenBytes)
	case len(request) > MaxRequestBytes:
		return nil, fmt.Errorf("%w: the certificate request is %d bytes, over %d", ErrRefused, len(request), MaxRequestBytes)
	}
	pub, err := parseRequest(request)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if err := a.review(ctx, node, token); err != nil {
		return nil, err
	}
	a.mu.Lock()
	ca := a.ca
	a.mu.Unlock()
	if ca.Cert == nil {
		return nil, errors.New("the agents' CA is not loaded yet")
	}
	return certs.IssueFor(ca, pub, node, certs.Server, a.opts.Validity)
}

func parseRequest(der []byte) (*ecdsa.PublicKey, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("the certificate request does not parse: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the certificate request is not signed by its key: %v", err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("the certificate request's key is a %T; give an ECDSA P-256 key", csr.PublicKey)
	}
	return pub, nil
}
