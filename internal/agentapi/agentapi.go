// Package agentapi holds what the two ends of the agent contract (proto/metalvip/agent/v1)
// must agree on beyond the generated code: the largest message either sends, the keepalive
// pings the agent tolerates, and the bounds of the agent's port. The CCM and metalvipctl dial
// with ClientOptions; metalvip-agent serves with the same figures. It decides nothing else.
package agentapi

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// MaxVIPsPerNode is the largest state an agent is sized for: this many VIPs on one node, with
// three L2 candidates each or BGP communities, and names of ordinary length.
const MaxVIPsPerNode = 100_000

// MaxMessageBytes bounds every message of the contract, both ways. Measured (TestLimits): a
// GetState answer costs about 265 bytes per VIP (the held state, 162, plus what each VIP is
// now) with 40-character Service names and 26-character node names, so 100,000 VIPs make
// about 27 MB; the limit leaves room for names twice that long. An answer over the limit is
// refused with RESOURCE_EXHAUSTED and says so, never cut.
const MaxMessageBytes = 64 << 20

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
// a source address holds at most MaxConnsPerAddr connections (more are closed at once); at
// most MaxPendingHandshakes connections are still in their handshake, the oldest being closed
// to make room for a new one, so that a flood of stalled connections never keeps the CCM out;
// a connection carries at most MaxStreams calls at once.
const (
	HandshakeTimeout     = 5 * time.Second
	MaxConnsPerAddr      = 8
	MaxPendingHandshakes = 64
	MaxStreams           = 32
)

// ClientOptions are the dial options of a client of the agent: message limits and keepalive
// pings the agent accepts.
func ClientOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ClientPingInterval, Timeout: PingTimeout, PermitWithoutStream: true}),
	}
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
