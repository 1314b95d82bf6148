package agentapi

import (
	"fmt"
	"testing"

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
