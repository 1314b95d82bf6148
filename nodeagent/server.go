package nodeagent

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/connlimit"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Who may call what: Apply changes what the node announces, so only the CCM; the viewer reads.
var roles = map[string][]string{
	agentv1.AgentService_Apply_FullMethodName:    {certs.CCMName},
	agentv1.AgentService_GetState_FullMethodName: {certs.CCMName, certs.ViewerName},
	agentv1.AgentService_Watch_FullMethodName:    {certs.CCMName, certs.ViewerName},
}

// NewServer returns the agent's gRPC server, bounded as agentapi says: handshake timeout,
// message limits, streams per connection, keepalive enforcement. With authorize, every call
// is checked against the role the client's verified certificate names (the CCM may Apply, the
// viewer only read); without (plaintext labs), nobody is checked. Serve it on a
// connlimit.Listener: the server marks each connection authenticated after its handshake.
func NewServer(a *Agent, creds credentials.TransportCredentials, authorize bool) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.Creds(markAuthenticated{creds}),
		grpc.ConnectionTimeout(agentapi.HandshakeTimeout),
		grpc.MaxRecvMsgSize(agentapi.MaxMessageBytes),
		grpc.MaxSendMsgSize(agentapi.MaxMessageBytes),
		grpc.MaxConcurrentStreams(agentapi.MaxStreams),
		grpc.MaxHeaderListSize(16 << 10),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: agentapi.MinPingInterval, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: agentapi.ServerPingInterval, Timeout: agentapi.PingTimeout, MaxConnectionIdle: agentapi.MaxIdle}),
		grpc.ChainUnaryInterceptor(limitAnswer),
	}
	if authorize {
		opts = append(opts, grpc.ChainUnaryInterceptor(authorizeUnary), grpc.ChainStreamInterceptor(authorizeStream))
	}
	srv := grpc.NewServer(opts...)
	agentv1.RegisterAgentServiceServer(srv, a)
	return srv
}

// allowed checks the caller of method against its roles.
func allowed(ctx context.Context, method string) error {
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
	return nil
}

func authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if err := allowed(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

func authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if err := allowed(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return next(srv, ss)
}

// limitAnswer refuses, with a reason, an answer over the message limit, rather than let the
// transport fail it with a bare error.
func limitAnswer(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	resp, err := next(ctx, req)
	if m, ok := resp.(proto.Message); ok && err == nil {
		if n := proto.Size(m); n > agentapi.MaxMessageBytes {
			return nil, status.Errorf(codes.ResourceExhausted,
				"%s: the answer is %d bytes, over the contract's %d: this node holds more than the %d VIPs an agent is sized for",
				info.FullMethod, n, agentapi.MaxMessageBytes, agentapi.MaxVIPsPerNode)
		}
	}
	return resp, err
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
