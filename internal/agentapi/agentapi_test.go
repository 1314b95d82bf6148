package agentapi

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// bigState is a node's state with n VIPs, half L2 with three candidates, half BGP with two
// communities, with Service and node names of ordinary length, and the GetState answer that
// holds it.
func bigState(n int) (*agentv1.DesiredState, *agentv1.GetStateResponse) {
	st := &agentv1.DesiredState{Term: 1 << 31, Generation: 1 << 40, Node: "node-with-a-long-name-0001"}
	resp := &agentv1.GetStateResponse{Node: st.Node, Term: st.Term, Generation: st.Generation}
	for i := range n {
		vip := fmt.Sprintf("2001:db8:ffff:ffff::%x:%x", i>>16, i&0xffff)
		an := &agentv1.Announcement{Vip: vip, Services: []string{fmt.Sprintf("namespace-of-some-length/service-name-%06d", i)}}
		if i%2 == 0 {
			an.Mode, an.L2 = agentv1.Mode_MODE_L2, &agentv1.L2Announcement{}
			for c := range 3 {
				an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: fmt.Sprintf("node-with-a-long-name-%04d", (i+c)%1000), Address: "198.51.100.123"})
			}
		} else {
			an.Mode, an.Bgp = agentv1.Mode_MODE_BGP, &agentv1.BGPAnnouncement{Communities: []string{"64512:100", "64512:200"}, LocalPref: 200}
		}
		st.Announcements = append(st.Announcements, an)
		resp.Announced = append(resp.Announced, &agentv1.AnnouncedVIP{Vip: vip, Mode: an.Mode, Active: true,
			Reason: "standby: node-with-a-long-name-0002 is alive and ranks higher", Interfaces: []string{"eth0"}})
	}
	resp.State = st
	return st, resp
}

// TestLimits measures the size of a state per VIP and checks that the largest supported
// state, and its GetState answer, fit the message limit with room to spare.
func TestLimits(t *testing.T) {
	for _, n := range []int{1_000, 10_000, MaxVIPsPerNode} {
		st, resp := bigState(n)
		apply, get := proto.Size(&agentv1.ApplyRequest{State: st}), proto.Size(resp)
		t.Logf("%6d VIPs: Apply %5.1f MB (%d B/VIP), GetState %5.1f MB (%d B/VIP)", n, float64(apply)/1e6, apply/n, float64(get)/1e6, get/n)
		if n == MaxVIPsPerNode && 2*get > MaxMessageBytes {
			t.Errorf("GetState of %d VIPs is %d bytes: less than half again to spare under the limit %d", n, get, MaxMessageBytes)
		}
	}
}

func TestAnAnswerOverTheLimitIsRefusedWithTheReason(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: agentv1.AgentService_GetState_FullMethodName}
	for _, tc := range []struct {
		name   string
		size   int
		refuse bool
	}{
		{"an answer under the limit goes out", 1 << 20, false},
		{"an answer over the limit is refused", MaxMessageBytes + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := limitAnswer(context.Background(), nil, info, func(context.Context, any) (any, error) {
				return &agentv1.GetStateResponse{Node: strings.Repeat("x", tc.size)}, nil
			})
			switch {
			case tc.refuse && (status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "VIPs an agent is sized for")):
				t.Errorf("limitAnswer = %v; want ResourceExhausted with the reason", err)
			case !tc.refuse && (err != nil || resp == nil):
				t.Errorf("limitAnswer = %v, %v; want the answer", resp, err)
			}
		})
	}
}

// answering serves GetState with a fixed answer.
type answering struct {
	agentv1.UnimplementedAgentServiceServer
	resp *agentv1.GetStateResponse
}

func (a answering) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	return a.resp, nil
}

// TestTheLargestStateCrossesBetweenClientAndServerOptions: a server with ServerOptions
// answers the largest state an agent is sized for, and a client with ClientOptions reads it;
// a client with gRPC's defaults cannot (what metalvipctl agent did); an answer over the limit
// arrives as RESOURCE_EXHAUSTED with the reason, not as the transport's bare error.
func TestTheLargestStateCrossesBetweenClientAndServerOptions(t *testing.T) {
	_, largest := bigState(MaxVIPsPerNode)
	for _, tc := range []struct {
		name     string
		resp     *agentv1.GetStateResponse
		defaults bool // dial with gRPC's defaults instead of ClientOptions
		want     codes.Code
		reason   string
	}{
		{"the largest state arrives whole", largest, false, codes.OK, ""},
		{"a client with gRPC's defaults cannot read it", largest, true, codes.ResourceExhausted, "larger than max"},
		{"an answer over the limit is refused with the reason", &agentv1.GetStateResponse{Node: strings.Repeat("x", MaxMessageBytes)}, false, codes.ResourceExhausted, "VIPs an agent is sized for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := bufconn.Listen(1 << 20)
			srv := grpc.NewServer(append(ServerOptions(), grpc.Creds(insecure.NewCredentials()))...)
			agentv1.RegisterAgentServiceServer(srv, answering{resp: tc.resp})
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })}
			if !tc.defaults {
				opts = append(opts, ClientOptions()...)
			}
			conn, err := grpc.NewClient("passthrough:///agent", opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			got, err := agentv1.NewAgentServiceClient(conn).GetState(context.Background(), &agentv1.GetStateRequest{})
			if status.Code(err) != tc.want || !strings.Contains(fmt.Sprint(err), tc.reason) {
				t.Fatalf("GetState = %v; want %v with %q", err, tc.want, tc.reason)
			}
			if tc.want == codes.OK && !proto.Equal(got, tc.resp) {
				t.Errorf("GetState answered %d VIPs, want the %d sent", len(got.GetAnnounced()), len(tc.resp.GetAnnounced()))
			}
		})
	}
}
