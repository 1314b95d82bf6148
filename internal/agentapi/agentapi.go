// Package agentapi holds what the two ends of the agent contract (proto/metalvip/agent/v1)
// must agree on beyond the generated code: the largest message either sends, the keepalive
// pings the agent tolerates, and the bounds of the agent's port. Both ends take them from
// here, never from figures of their own: every client of the agent (the CCM, its enrollment,
// metalvipctl, the test harnesses) dials with ClientOptions, and every server of the contract
// (metalvip-agent through nodeagent.NewServer, and the fakes that stand for it in tests)
// serves with ServerOptions. It decides nothing else: credentials, roles and the service
// itself are the caller's.
package agentapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/metalvip/metalvip/internal/version"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// ThisBuild is this binary's build as the contract carries it (ApplyRequest.sender,
// GetStateResponse.build): the same version and commit as its --version. Callers must not
// change it.
var ThisBuild = sync.OnceValue(func() *agentv1.Build {
	i := version.Get()
	return &agentv1.Build{Version: i.Version, Commit: i.Commit}
})

// MaxVIPsPerNode is the largest state an agent is sized for: this many VIPs on one node, with
// three L2 candidates each or BGP communities, and names of ordinary length.
const MaxVIPsPerNode = 100_000

// MaxMessageBytes bounds every message of the contract, both ways. Measured (TestLimits): a
// GetState answer costs about 265 bytes per VIP (the held state, 162, plus what each VIP is
// now) with 40-character Service names and 26-character node names, so 100,000 VIPs make
// about 27 MB; the limit leaves room for names twice that long. An answer over the limit is
// refused with RESOURCE_EXHAUSTED and says so, never cut. A client dialling without
// ClientOptions receives at most gRPC's default (4 MiB): a large node's answer fails there.
const MaxMessageBytes = 64 << 20

// MaxHeaderBytes bounds the headers of a call to the agent. The contract carries nothing in
// metadata: the bound only keeps a client from making the agent hold large headers.
const MaxHeaderBytes = 16 << 10

// Keepalive: the agent pings an idle connection every ServerPingInterval and closes it when
// no answer comes within PingTimeout; a client may ping no more often than MinPingInterval
// (the agent closes the connection of one that does), and ClientOptions pings every
// ClientPingInterval.
const (
	ServerPingInterval = 30 * time.Second
	PingTimeout        = 10 * time.Second
	MinPingInterval    = 15 * time.Second
	ClientPingInterval = 30 * time.Second
	// MaxIdle closes a connection with no call for that long (a forgotten viewer); the CCM's
	// always has a Watch open.
	MaxIdle = 10 * time.Minute
)

// Bounds of the agent's gRPC port: a client has HandshakeTimeout to finish the TLS handshake;
// at most MaxConnsPerAddr connections of a source address and MaxPendingHandshakes in all are
// still in their handshake, the oldest being closed to make room for a new one, so that
// stalled connections (even from the CCM's own address) never keep the CCM out;
// a connection carries at most MaxStreams calls at once.
const (
	HandshakeTimeout     = 5 * time.Second
	MaxConnsPerAddr      = 8
	MaxPendingHandshakes = 64
	MaxStreams           = 32
)

// ClientOptions are the dial options of a client of the agent: message limits and keepalive
// pings the agent accepts. The caller adds its transport credentials, and may add options
// that are its own business (backoff, a dialer).
func ClientOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ClientPingInterval, Timeout: PingTimeout, PermitWithoutStream: true}),
	}
}

// ServerOptions are the options of a server of the agent's API: the handshake timeout,
// message and header limits, calls per connection, keepalive pings and their enforcement, and
// an interceptor that refuses an answer over MaxMessageBytes with the reason. The caller adds
// its transport credentials (grpc.Creds) and its own interceptors, which run inside this one.
// The connection bounds (MaxConnsPerAddr, MaxPendingHandshakes) belong to the listener
// (internal/connlimit), not to these options.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.MaxConcurrentStreams(MaxStreams),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinPingInterval, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: ServerPingInterval, Timeout: PingTimeout, MaxConnectionIdle: MaxIdle}),
		grpc.ChainUnaryInterceptor(limitAnswer),
	}
}

// limitAnswer refuses, with a reason, an answer over the message limit, rather than let the
// transport fail it with a bare error.
func limitAnswer(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	resp, err := next(ctx, req)
	if m, ok := resp.(proto.Message); ok && err == nil {
		if n := proto.Size(m); n > MaxMessageBytes {
			return nil, status.Errorf(codes.ResourceExhausted,
				"%s: the answer is %d bytes, over the contract's %d: this node holds more than the %d VIPs an agent is sized for",
				info.FullMethod, n, MaxMessageBytes, MaxVIPsPerNode)
		}
	}
	return resp, err
}

// Restamped returns a shallow copy of st with its term and generation set to term and gen. The
// content (announcements, peers, options) is shared with st, not copied, so neither may be
// changed afterwards. Every field is carried over, those added to DesiredState later too.
func Restamped(st *agentv1.DesiredState, term, gen uint64) *agentv1.DesiredState {
	out := &agentv1.DesiredState{}
	dst := out.ProtoReflect()
	st.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	out.Term, out.Generation = term, gen
	return out
}

// SameContent reports whether two states say the same, whatever their terms and generations.
func SameContent(x, y *agentv1.DesiredState) bool {
	return proto.Equal(Restamped(x, 0, 0), Restamped(y, 0, 0))
}

// SessionKey names one BGP session of a node as both ends match them: BGPPeer on the way to
// the agent, PeerStatus and the agent's refusals back (Refusal.item), and the CCM's "one
// session per router on a node". It is the router's address, or "interface NAME" for an
// unnumbered session (BGPPeer.interface), which has no address.
func SessionKey(address, iface string) string {
	if iface != "" {
		return "interface " + iface
	}
	return address
}

// PeerKey is SessionKey of a BGPPeer.
func PeerKey(p *agentv1.BGPPeer) string { return SessionKey(p.GetAddress(), p.GetInterface()) }

// StatusKey is SessionKey of a PeerStatus.
func StatusKey(s *agentv1.PeerStatus) string { return SessionKey(s.GetAddress(), s.GetInterface()) }

// CheckInterfaceName reports whether name can be a network interface's name (an IPPool's
// announce.l2.interfaces, an unnumbered session's BGPPeer.interface): 1 to 15 printable ASCII
// characters without '/' or ':', not "." or "..", as the CRDs' validation says
// (^[!-.0-9;-~]{1,15}$).
func CheckInterfaceName(name string) error {
	ok := name != "" && len(name) <= 15 && name != "." && name != ".."
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c > ' ' && c <= '~' && c != '/' && c != ':'
	}
	if !ok {
		return fmt.Errorf("%q is not an interface name: 1 to 15 ASCII characters without '/', ':' or spaces, and not . or .., such as eth1", name)
	}
	return nil
}
