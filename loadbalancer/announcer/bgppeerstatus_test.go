package announcer

import (
	"testing"

	"github.com/metalvip/metalvip/loadbalancer/pools"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestPeerSessions(t *testing.T) {
	peer := &pools.Peer{Name: "router", Session: &agentv1.BGPPeer{Address: "198.51.100.1"}}
	up := &agentv1.PeerStatus{Address: "198.51.100.1", State: "Established", BfdState: "Up", RoutesAdvertised: 4, SinceUnix: 1700000000}
	other := &agentv1.PeerStatus{Address: "198.51.100.9", State: "Established"}
	active := &agentv1.PeerStatus{Address: "198.51.100.1", State: "Active", LastError: "hold timer expired"}
	unnumberedUp := &agentv1.PeerStatus{Interface: "eth1", State: "Established", BfdState: "Up", RoutesAdvertised: 4, SinceUnix: 1700000000}
	all := func(string) bool { return true }
	for _, tc := range []struct {
		name      string
		nodes     []string
		reachable func(string) bool
		sessions  map[string][]*agentv1.PeerStatus
		left      map[string]bool
		summary   string
		states    []string
	}{
		{"every node established counts all of them", []string{"a", "b"}, all,
			map[string][]*agentv1.PeerStatus{"a": {up}, "b": {other, up}}, nil, "Established 2/2", []string{"Established", "Established"}},
		{"a node whose agent is unreachable is Unknown, not Established", []string{"a", "b"}, func(n string) bool { return n == "a" },
			map[string][]*agentv1.PeerStatus{"a": {up}, "b": {up}}, nil, "Established 1/2", []string{"Established", SessionUnknown}},
		{"a node with only another peer's session has none with this one", []string{"a"}, all,
			map[string][]*agentv1.PeerStatus{"a": {other}}, nil, "Established 0/1", []string{SessionNotConfigured}},
		{"a session down shows its state and last error", []string{"a"}, all,
			map[string][]*agentv1.PeerStatus{"a": {active}}, nil, "Established 0/1", []string{"Active"}},
		{"a node left to an older peer of the same address is not counted as this one's", []string{"a"}, all,
			map[string][]*agentv1.PeerStatus{"a": {up}}, map[string]bool{"a": true}, "Established 0/1", []string{SessionNotConfigured}},
		{"no node selected gives 0/0", nil, all, nil, nil, "Established 0/0", nil},
		{"an unnumbered session is not the numbered peer's", []string{"a"}, all,
			map[string][]*agentv1.PeerStatus{"a": {unnumberedUp}}, nil, "Established 0/1", []string{SessionNotConfigured}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum, list := PeerSessions(peer, tc.nodes, tc.reachable, tc.sessions, tc.left)
			if sum != tc.summary {
				t.Errorf("summary %q, want %q", sum, tc.summary)
			}
			if len(list) != len(tc.states) {
				t.Fatalf("%d entries, want %d", len(list), len(tc.states))
			}
			for i, st := range list {
				if st.Node != tc.nodes[i] || st.State != tc.states[i] {
					t.Errorf("entry %d: %s %s, want %s %s", i, st.Node, st.State, tc.nodes[i], tc.states[i])
				}
				if st.State == "Established" && (st.RoutesAdvertised != 4 || st.BFDState != "Up" || st.Since == nil) {
					t.Errorf("entry %d lost the agent's detail: %+v", i, st)
				}
				if st.State == "Active" && st.LastError != "hold timer expired" {
					t.Errorf("entry %d lost the last error: %+v", i, st)
				}
			}
		})
	}
}

func TestPeerSessionsOfAnUnnumberedPeerMatchItsInterface(t *testing.T) {
	peer := &pools.Peer{Name: "tor", Session: &agentv1.BGPPeer{Interface: "eth1"}}
	sessions := map[string][]*agentv1.PeerStatus{
		"a": {{Address: "198.51.100.1", State: "Established"}, {Interface: "eth1", State: "Established"}},
		"b": {{Interface: "eth2", State: "Established"}, {Interface: "eth1", State: "Active", LastError: "no ipv6 link-local neighbor found"}},
	}
	sum, list := PeerSessions(peer, []string{"a", "b"}, func(string) bool { return true }, sessions, nil)
	if sum != "Established 1/2" || list[0].State != "Established" || list[1].State != "Active" || list[1].LastError == "" {
		t.Errorf("%s %+v", sum, list)
	}
}
