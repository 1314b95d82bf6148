package agentclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Enroller issues the agents' certificates (identity.Authority): it is the CCM's certificate
// and the CA the agents' chain to, and signs a node's certificate for an agent that proves it
// runs there.
type Enroller interface {
	certs.Source
	Sign(ctx context.Context, node string, request []byte, token string) ([]byte, error)
}

var (
	agentEnrollments = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "metalvip", Name: "agent_enrollments_total",
		Help:           "Agent certificates issued (ok: a first one or one after expiry; renewed: over the agent's mutual TLS), refused (the agent did not prove its node), or failed (the agent or the API server did not answer).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
)

// enrolledTLS is the mutual TLS towards an enrolled agent: the CCM's certificate from the
// Enroller, the agent's checked against its CA and node; it notes when the agent's
// certificate is due for renewal.
func (a *Agents) enrolledTLS(c *agentConn) *tls.Config {
	cfg := certs.ClientConfigFrom(a.cfg.Enroll, c.node)
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return err
		}
		c.renewAt.Store(identity.RenewAt(cs.PeerCertificates[0]).UnixNano())
		return nil
	}
	return cfg
}

// enrollNew enrolls an agent the CCM cannot reach over mutual TLS, on a connection of its own
// that does not check the agent's certificate (it has none anyone trusts yet). Nothing secret
// crosses it: the agent's answer is checked by the API server (a token bound to a Pod on the
// node dialled) and what goes back is a certificate, public. An agent that is down, or one
// that is enrolled but failed otherwise, costs a dial.
func (a *Agents) enrollNew(ctx context.Context, c *agentConn) error {
	if a.cfg.Enroll == nil {
		return errors.New("no enrollment")
	}
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // see above: the token, not this connection, proves the node
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return a.cfg.Enroll.Certificate()
		},
	}
	opts := append(agentapi.ClientOptions(), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if a.cfg.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(a.cfg.Dial))
	}
	conn, err := grpc.NewClient("passthrough:///"+netip.AddrPortFrom(c.addr, uint16(a.cfg.Port)).String(), opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := a.enroll(ctx, c, agentv1.NewAgentServiceClient(conn), "ok"); err != nil {
		return err
	}
	// The agent serves its new certificate from the next handshake: reconnect now rather
	// than after the connection's backoff.
	c.conn.ResetConnectBackoff()
	waitReady(ctx, c.conn, a.cfg.Timeout)
	return nil
}

// renewDue renews the agent's certificate over the established mutual TLS once it is due;
// the connection (and its Watch stream) stays up, the agent serves the new one to the next.
func (a *Agents) renewDue(ctx context.Context, c *agentConn) {
	at := c.renewAt.Load()
	if a.cfg.Enroll == nil || at == 0 || time.Now().UnixNano() < at {
		return
	}
	// A failure is tried again at the next probe.
	_ = a.enroll(ctx, c, c.client, "renewed")
}

// enroll asks the agent for a request and its token, has the Enroller check and sign it,
// and installs the certificate.
func (a *Agents) enroll(ctx context.Context, c *agentConn, client agentv1.AgentServiceClient, ok string) error {
	// Two calls to the agent and a TokenReview.
	cctx, cancel := context.WithTimeout(ctx, 2*a.cfg.Timeout)
	defer cancel()
	resp, err := client.Enroll(cctx, &agentv1.EnrollRequest{})
	if err != nil {
		klog.V(2).InfoS("Agent not enrolled: it does not answer Enroll", "node", c.node, "err", err)
		agentEnrollments.WithLabelValues("failed").Inc()
		return fmt.Errorf("enroll %s: %w", c.node, err)
	}
	if resp.GetNode() != c.node {
		err := fmt.Errorf("%w: the agent at %s says it runs on %q, not %s", identity.ErrRefused, c.addr, resp.GetNode(), c.node)
		klog.ErrorS(err, "Agent enrollment refused", "node", c.node)
		agentEnrollments.WithLabelValues("refused").Inc()
		return err
	}
	cert, err := a.cfg.Enroll.Sign(cctx, c.node, resp.GetCertificateRequest(), resp.GetToken())
	if err != nil {
		result := "failed"
		if errors.Is(err, identity.ErrRefused) {
			result = "refused"
		}
		klog.ErrorS(err, "Agent enrollment refused", "node", c.node)
		agentEnrollments.WithLabelValues(result).Inc()
		return err
	}
	if _, err := client.Install(cctx, &agentv1.InstallRequest{Certificate: cert}); err != nil {
		klog.ErrorS(err, "Agent refused the certificate issued for it", "node", c.node)
		agentEnrollments.WithLabelValues("failed").Inc()
		return fmt.Errorf("install on %s: %w", c.node, err)
	}
	agentEnrollments.WithLabelValues(ok).Inc()
	// Due again by this certificate: the connection stays up, so no handshake would say so.
	if b, _ := pem.Decode(cert); b != nil {
		if leaf, err := x509.ParseCertificate(b.Bytes); err == nil {
			c.renewAt.Store(identity.RenewAt(leaf).UnixNano())
		}
	}
	klog.InfoS("Agent enrolled", "node", c.node, "result", ok)
	return nil
}

// waitReady waits up to timeout for conn to connect.
func waitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready || !conn.WaitForStateChange(cctx, s) {
			return
		}
	}
}
