package nodeagent

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/connlimit"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Who may call what: Apply changes what the node announces, so only the CCM; the viewer reads.
var roles = map[string][]string{
	agentv1.AgentService_Apply_FullMethodName:    {certs.CCMName},
	agentv1.AgentService_GetState_FullMethodName: {certs.CCMName, certs.ViewerName},
	agentv1.AgentService_Watch_FullMethodName:    {certs.CCMName, certs.ViewerName},
	agentv1.AgentService_Enroll_FullMethodName:   {certs.CCMName},
	agentv1.AgentService_Install_FullMethodName:  {certs.CCMName},
}

// ServerOption adds to NewServer.
type ServerOption func(*serverConfig)

type serverConfig struct {
	enrollee *identity.Enrollee
	unary    []grpc.UnaryServerInterceptor
	stream   []grpc.StreamServerInterceptor
}

// WithEnrollee serves Enroll and Install for the agent's enrollment (docs/agent-tls.md), and
// while e holds no valid certificate answers nothing else: the connection's server
// certificate is then one nobody trusts.
func WithEnrollee(e *identity.Enrollee) ServerOption {
	return func(c *serverConfig) { c.enrollee = e }
}

// WithInterceptors runs unary and stream (either may be nil) inside the server's own (the
// answer limit, the role check), on the calls those let through: a harness that stands for
// many agents (test/scale) counts what lands on the server production runs, not a copy.
func WithInterceptors(unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor) ServerOption {
	return func(c *serverConfig) {
		if unary != nil {
			c.unary = append(c.unary, unary)
		}
		if stream != nil {
			c.stream = append(c.stream, stream)
		}
	}
}

// enrolling is the agent's service with its enrollment.
type enrolling struct {
	*Agent
	enrollee *identity.Enrollee
}

func (s *enrolling) Enroll(context.Context, *agentv1.EnrollRequest) (*agentv1.EnrollResponse, error) {
	if s.enrollee == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent's certificate comes from files (--tls-mode=files): nothing to enroll")
	}
	r, err := s.enrollee.Enroll()
	if err != nil {
		// The token is missing or unreadable: the node's setup, not the call, is at fault.
		return nil, status.Errorf(codes.FailedPrecondition, "enroll: %v", err)
	}
	return &agentv1.EnrollResponse{Node: r.Node, CertificateRequest: r.CertificateRequest, Token: r.Token}, nil
}

func (s *enrolling) Install(_ context.Context, req *agentv1.InstallRequest) (*agentv1.InstallResponse, error) {
	if s.enrollee == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent's certificate comes from files (--tls-mode=files): nothing to install")
	}
	if err := s.enrollee.Install(req.GetCertificate()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "install: %v", err)
	}
	return &agentv1.InstallResponse{}, nil
}

// NewServer returns the agent's gRPC server, bounded by agentapi.ServerOptions: handshake
// timeout, message and header limits, streams per connection, keepalive enforcement, an answer
// over the limit refused with the reason. With authorize, every call is checked against the
// role the client's verified certificate names (the CCM may Apply, the viewer only read);
// without (plaintext labs), nobody is checked. WithEnrollee adds the agent's enrollment.
// Serve it on a connlimit.Listener: the server marks each connection authenticated after its
// handshake.
func NewServer(a *Agent, creds credentials.TransportCredentials, authorize bool, options ...ServerOption) *grpc.Server {
	var cfg serverConfig
	for _, o := range options {
		o(&cfg)
	}
	svc := &enrolling{Agent: a, enrollee: cfg.enrollee}
	opts := append(agentapi.ServerOptions(), grpc.Creds(markAuthenticated{creds}))
	if authorize {
		az := authorizer{svc.enrollee}
		opts = append(opts, grpc.ChainUnaryInterceptor(az.unary), grpc.ChainStreamInterceptor(az.stream))
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(cfg.unary...), grpc.ChainStreamInterceptor(cfg.stream...))
	srv := grpc.NewServer(opts...)
	agentv1.RegisterAgentServiceServer(srv, svc)
	return srv
}

// authorizer checks every call: the caller's role, and, with an enrollee, that the agent is
// enrolled for everything but enrolling.
type authorizer struct {
	enrollee *identity.Enrollee
}

// allowed checks the caller of method against its roles.
func (az authorizer) allowed(ctx context.Context, method string) error {
	want, ok := roles[method]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s: no role may call it", method)
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return status.Error(codes.Unauthenticated, "not a TLS connection")
	}
	if _, err := certs.Identity(info.State, want...); err != nil {
		return status.Errorf(codes.PermissionDenied, "%s: %v", method, err)
	}
	enrolling := method == agentv1.AgentService_Enroll_FullMethodName || method == agentv1.AgentService_Install_FullMethodName
	if az.enrollee != nil && !enrolling && !az.enrollee.Enrolled() {
		return status.Errorf(codes.Unavailable, "%s: %v", method, identity.ErrNotEnrolled)
	}
	return nil
}

func (az authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if err := az.allowed(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

func (az authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if err := az.allowed(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return next(srv, ss)
}

// markAuthenticated tells the connection limiter that a connection finished its handshake.
type markAuthenticated struct {
	credentials.TransportCredentials
}

func (m markAuthenticated) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := m.TransportCredentials.ServerHandshake(c)
	if err == nil {
		connlimit.Authenticated(c)
	}
	return out, info, err
}

func (m markAuthenticated) Clone() credentials.TransportCredentials {
	return markAuthenticated{m.TransportCredentials.Clone()}
}
