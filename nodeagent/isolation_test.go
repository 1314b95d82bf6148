package nodeagent

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// goodItems are an L2 VIP, a BGP VIP and a BGP peer that are fine; each case adds one bad item
// to them and checks that the bad one alone is refused.
func goodItems() *agentv1.DesiredState {
	return state(1, 1, l2VIP("203.0.113.10", "node-a"), bgpVIP("203.0.113.20"))
}

func bgpPeerOf(addr string, f func(p *agentv1.BGPPeer)) *agentv1.BGPPeer {
	p := &agentv1.BGPPeer{Address: addr, PeerAsn: 64496}
	if f != nil {
		f(p)
	}
	return p
}

func TestABadItemIsRefusedAloneAndTheRestApplied(t *testing.T) {
	community := func(c string) *agentv1.Announcement {
		a := bgpVIP("203.0.113.21")
		a.Bgp.Communities = []string{"64496:1", c}
		return a
	}
	for _, tc := range []struct {
		name      string
		add       func(s *agentv1.DesiredState)
		kind      agentv1.Refusal_Kind
		key       string
		field     string
		wantWrite string // what the reason tells the user to write
	}{
		{"a community over 65535 is refused alone", func(s *agentv1.DesiredState) { s.Announcements = append(s.Announcements, community("65536:1")) },
			agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.21", "announcements[2].bgp.communities[1]", "both parts from 0 to 65535"},
		{"a large community with two parts is refused alone", func(s *agentv1.DesiredState) {
			a := bgpVIP("203.0.113.21")
			a.Bgp.LargeCommunities = []string{"4200000000:1:2", "64496:1"}
			s.Announcements = append(s.Announcements, a)
		}, agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.21", "announcements[2].bgp.large_communities[1]", "write ASN:value1:value2"},
		{"a community that is a word is refused alone", func(s *agentv1.DesiredState) { s.Announcements = append(s.Announcements, community("no-export")) },
			agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.21", "announcements[2].bgp.communities[1]", "write ASN:value"},
		{"a VIP that is no address is refused alone", func(s *agentv1.DesiredState) {
			s.Announcements = append(s.Announcements, l2VIP("203.0.113.300", "node-a"))
		},
			agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.300", "announcements[2].vip", "give an IPv4 or IPv6 address"},
		{"a multicast VIP is refused alone", func(s *agentv1.DesiredState) { s.Announcements = append(s.Announcements, bgpVIP("224.0.0.1")) },
			agentv1.Refusal_KIND_ANNOUNCEMENT, "224.0.0.1", "announcements[2].vip", "give a global or unique local address"},
		{"a VIP given twice is refused the second time", func(s *agentv1.DesiredState) { s.Announcements = append(s.Announcements, bgpVIP("203.0.113.10")) },
			agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.10", "announcements[2].vip", "give each VIP once"},
		{"a VIP without a mode is refused alone", func(s *agentv1.DesiredState) {
			s.Announcements = append(s.Announcements, &agentv1.Announcement{Vip: "203.0.113.22"})
		}, agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.22", "announcements[2].mode", "give MODE_L2 or MODE_BGP"},
		{"an L2 VIP without candidates is refused alone", func(s *agentv1.DesiredState) { s.Announcements = append(s.Announcements, l2VIP("203.0.113.23")) },
			agentv1.Refusal_KIND_ANNOUNCEMENT, "203.0.113.23", "announcements[2].l2.candidates", "at least one candidate"},
		{"a peer at 0.0.0.0 is refused alone", func(s *agentv1.DesiredState) { s.BgpPeers = append(s.BgpPeers, bgpPeerOf("0.0.0.0", nil)) },
			agentv1.Refusal_KIND_BGP_PEER, "0.0.0.0", "bgp_peers[1].address", "give the peer's own address"},
		{"a link-local peer is refused alone", func(s *agentv1.DesiredState) { s.BgpPeers = append(s.BgpPeers, bgpPeerOf("fe80::1", nil)) },
			agentv1.Refusal_KIND_BGP_PEER, "fe80::1", "bgp_peers[1].address", "give the peer's global or unique local address"},
		{"an unnumbered peer with a source address is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("", func(p *agentv1.BGPPeer) { p.Interface, p.SourceAddress = "eth1", "198.51.100.11" }))
		}, agentv1.Refusal_KIND_BGP_PEER, "interface eth1", "bgp_peers[1].source_address", "remove the source address"},
		{"a multicast peer is refused alone", func(s *agentv1.DesiredState) { s.BgpPeers = append(s.BgpPeers, bgpPeerOf("ff02::5", nil)) },
			agentv1.Refusal_KIND_BGP_PEER, "ff02::5", "bgp_peers[1].address", "not a unicast address"},
		{"a peer listed twice is refused the second time", func(s *agentv1.DesiredState) { s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.1", nil)) },
			agentv1.Refusal_KIND_BGP_PEER, "198.51.100.1", "bgp_peers[1].address", "give each peer once"},
		{"a peer whose keepalive is not under the hold time is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.HoldTimeSeconds, p.KeepaliveSeconds = 9, 9 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].keepalive_seconds", "give a keepalive under the hold time"},
		{"a peer whose keepalive is not under the default hold time is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.KeepaliveSeconds = 90 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].keepalive_seconds", "hold time 1m30s"},
		{"a peer with a hold time of 2 s is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.HoldTimeSeconds = 2 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].hold_time_seconds", "from 3s to 65535s"},
		{"a peer without an ASN is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.PeerAsn = 0 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].peer_asn", "give the peer's AS number"},
		{"a multihop peer with BFD is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.EbgpMultihopTtl, p.Bfd = 2, &agentv1.BFD{Enabled: true} }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].bfd.enabled", "turn BFD off"},
		{"a peer whose port is out of range is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.Port = 70000 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].port", "1 to 65535"},
		{"a peer that is no address is refused alone", func(s *agentv1.DesiredState) { s.BgpPeers = append(s.BgpPeers, bgpPeerOf("router", nil)) },
			agentv1.Refusal_KIND_BGP_PEER, "router", "bgp_peers[1].address", "give the peer's address"},
		{"a peer whose source address is of the other family is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.SourceAddress = "2001:db8:1::11" }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].source_address", "not of the address family of 198.51.100.2"},
		{"a peer whose source address is no address is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.SourceAddress = "eth0" }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].source_address", "give one this node holds"},
		{"a peer whose source address the node does not hold is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.SourceAddress = "198.51.100.249" }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].source_address", "is not an address of node node-a"},
		{"a peer whose connect retry is out of range is refused alone", func(s *agentv1.DesiredState) {
			s.BgpPeers = append(s.BgpPeers, bgpPeerOf("198.51.100.2", func(p *agentv1.BGPPeer) { p.ConnectRetrySeconds = 70000 }))
		}, agentv1.Refusal_KIND_BGP_PEER, "198.51.100.2", "bgp_peers[1].connect_retry_seconds", "1 to 65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := serve(t, t.TempDir())
			c := h.ccm(t)
			st := goodItems()
			tc.add(st)
			resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: st})
			if err != nil {
				t.Fatalf("Apply = %v; want the state taken with one item refused", err)
			}
			check := func(where string, refused []*agentv1.Refusal) {
				t.Helper()
				if len(refused) != 1 {
					t.Fatalf("%s lists %d refusals %v; want 1", where, len(refused), refused)
				}
				r := refused[0]
				if r.GetKind() != tc.kind || r.GetKey() != tc.key || r.GetField() != tc.field || !strings.Contains(r.GetReason(), tc.wantWrite) {
					t.Errorf("%s: refusal %v; want %v %s at %s saying %q", where, r, tc.kind, tc.key, tc.field, tc.wantWrite)
				}
			}
			check("the Apply answer", resp.GetRefused())
			if len(resp.GetProblems()) != 0 {
				t.Errorf("Apply problems %v; a refused item is not a problem of the node", resp.GetProblems())
			}
			got, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			check("GetState", got.GetRefused())
			// Whether the node holds an address only the agent knows, not CheckState (the CCM's).
			agentOnly := strings.Contains(tc.wantWrite, "is not an address of node")
			if refused, err := CheckState(st, "node-a"); agentOnly && (err != nil || len(refused) != 0) {
				t.Errorf("CheckState = %v, %v; want nothing refused (only the agent knows)", refused, err)
			} else if !agentOnly && (err != nil || len(refused) != 1) {
				t.Errorf("CheckState = %v, %v; want the one refusal Apply made", refused, err)
			}

			// Everything else is applied.
			if l := h.l2.last(); !slices.ContainsFunc(l, func(v l2.VIP) bool { return v.Addr == netip.MustParseAddr("203.0.113.10") }) {
				t.Errorf("the good L2 VIP is not answered: %v", l)
			}
			h.bgp.mu.Lock()
			routes, peers := h.bgp.routes, h.bgp.peers
			h.bgp.mu.Unlock()
			if !slices.ContainsFunc(routes, func(r bgp.Route) bool { return r.Prefix == netip.MustParsePrefix("203.0.113.20/32") }) {
				t.Errorf("the good BGP VIP is not advertised: %v", routes)
			}
			if !slices.ContainsFunc(peers, func(p bgp.Peer) bool { return p.Address == netip.MustParseAddr("198.51.100.1") }) {
				t.Errorf("the good BGP peer has no session: %v", peers)
			}
			if tc.kind == agentv1.Refusal_KIND_BGP_PEER && len(peers) != 1 {
				t.Errorf("the speaker got %d peers; want the good one alone", len(peers))
			}
			if tc.kind == agentv1.Refusal_KIND_ANNOUNCEMENT && len(routes)+len(h.l2.last()) != 2 {
				t.Errorf("the speakers got %d routes and %v; want the good VIPs alone", len(routes), h.l2.last())
			}
		})
	}
}

func TestAPeerTheSpeakerRefusesCostsOnlyItsSession(t *testing.T) {
	h := serve(t, t.TempDir())
	h.bgp.refuse = errors.New("gobgp: add bgp peer 198.51.100.1: refused")
	resp, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: goodItems()})
	if err != nil {
		t.Fatal(err)
	}
	h.bgp.mu.Lock()
	routes := h.bgp.routes
	h.bgp.mu.Unlock()
	if len(routes) != 1 {
		t.Errorf("routes %v after the speaker refused a peer; want the BGP VIP advertised on the other sessions", routes)
	}
	if !slices.ContainsFunc(resp.GetProblems(), func(p string) bool { return strings.Contains(p, "refused") }) {
		t.Errorf("problems %v; want the speaker's refusal", resp.GetProblems())
	}
}

func TestApplyAnswersWithWhatIsHeld(t *testing.T) {
	h := serve(t, t.TempDir())
	c := h.ccm(t)
	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(7, 40, l2VIP("203.0.113.10", "node-a"))}); err != nil {
		t.Fatal(err)
	}
	calls := h.l2.calls()
	for _, tc := range []struct {
		name string
		gen  uint64
	}{
		{"a CCM that restarted its generations at 1 is told 40", 1},
		{"the same generation again is told 40", 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(7, tc.gen, l2VIP("203.0.113.99", "node-a"))})
			if err != nil || r.GetChanged() || r.GetTerm() != 7 || r.GetGeneration() != 40 {
				t.Errorf("Apply = %v, %v; want unchanged, holding term 7 generation 40", r, err)
			}
			if h.l2.calls() != calls {
				t.Error("a generation not above the held one changed the speaker")
			}
		})
	}
	t.Run("a lower term is refused with the held term", func(t *testing.T) {
		_, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(6, 100)})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "accepted term 7") {
			t.Errorf("Apply = %v; want FailedPrecondition naming term 7", err)
		}
	})
	t.Run("the next generation is taken", func(t *testing.T) {
		r, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(7, 41, l2VIP("203.0.113.99", "node-a"))})
		if err != nil || !r.GetChanged() || r.GetGeneration() != 41 {
			t.Errorf("Apply = %v, %v; want generation 41 applied", r, err)
		}
	})
}

func TestACorruptStateFileLeavesTheAgentRunning(t *testing.T) {
	good, err := os.ReadFile(func() string {
		dir := t.TempDir()
		if err := saveState(dir, state(3, 9, l2VIP("203.0.113.10", "node-a"))); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, stateFile)
	}())
	if err != nil {
		t.Fatal(err)
	}
	other := state(3, 9, l2VIP("203.0.113.10", "node-b"))
	other.Node = "node-b"
	for _, tc := range []struct {
		name    string
		content []byte
		want    string
	}{
		{"a truncated file", good[:len(good)/2], "truncated"},
		{"a file with one byte changed", func() []byte {
			b := slices.Clone(good)
			b[len(b)-3] ^= 0x20
			return b
		}(), "damaged"},
		{"an empty file", nil, "empty"},
		{"garbage", []byte("\x00\xff\xfe not json at all"), "does not parse"},
		{"a state for another node", func() []byte {
			d := t.TempDir()
			_ = saveState(d, other)
			b, _ := os.ReadFile(filepath.Join(d, stateFile))
			return b
		}(), "does not validate"},
	} {
		t.Run(tc.name+" costs the saved state, not the agent", func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, stateFile), tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			h := serve(t, dir)
			if got := h.l2.last(); len(got) != 0 {
				t.Errorf("the speaker answers %v from a state file that is not usable", got)
			}
			st, err := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			p := strings.Join(st.GetProblems(), "; ")
			if !strings.Contains(p, stateFile) || !strings.Contains(p, tc.want) || !strings.Contains(p, "moved to") {
				t.Errorf("GetState problems %q; want %s, %q and where it was moved", p, stateFile, tc.want)
			}
			if st.GetGeneration() != 0 || st.GetRestored() {
				t.Errorf("GetState %v; want nothing held", st)
			}
			if _, err := os.Stat(filepath.Join(dir, stateFile+".corrupt")); err != nil {
				t.Errorf("the file was not moved aside: %v", err)
			}
			r, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 1, l2VIP("203.0.113.10", "node-a"))})
			if err != nil || len(r.GetProblems()) != 0 {
				t.Fatalf("the next Apply = %v, %v; want it taken and the problem gone", r, err)
			}
			if got := h.l2.last(); len(got) != 1 {
				t.Errorf("after the next Apply the speaker answers %v", got)
			}
		})
	}
}

func TestAStateSavedWithAClockTermKeepsAnnouncingUntilALeaderSpeaks(t *testing.T) {
	dir := t.TempDir()
	if err := saveState(dir, state(1764578400000000, 5, l2VIP("203.0.113.10", "node-a"))); err != nil {
		t.Fatal(err)
	}
	h := serve(t, dir)
	if got := h.l2.last(); len(got) != 1 {
		t.Errorf("the clock-era state was not resumed: %v", got)
	}
	if r, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 1)}); err != nil || !r.GetChanged() {
		t.Errorf("the first leader's term 1 = %v, %v; want it to replace the clock-based term", r, err)
	}
}

func TestTheViewerMayReadButNotApply(t *testing.T) {
	h := serve(t, t.TempDir())
	st := goodItems()
	st.BgpPeers[0].Password = "md5-secret"
	if _, err := h.ccm(t).Apply(ctx(t), &agentv1.ApplyRequest{State: st}); err != nil {
		t.Fatal(err)
	}
	v := h.viewer(t)
	got, err := v.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatalf("the viewer's GetState = %v", err)
	}
	if strings.Contains(got.String(), "md5-secret") || got.GetState().GetBgpPeers()[0].GetPassword() != "" {
		t.Error("GetState holds the BGP password")
	}
	w, err := v.Watch(ctx(t), &agentv1.WatchRequest{})
	if err == nil {
		_, err = w.Header()
	}
	if err != nil {
		t.Errorf("the viewer's Watch = %v", err)
	}
	_, err = v.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 2)})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("the viewer's Apply = %v; want PermissionDenied", err)
	}
	if after, _ := h.ccm(t).GetState(ctx(t), &agentv1.GetStateRequest{}); after.GetGeneration() != 1 {
		t.Errorf("the viewer's Apply changed the generation to %d", after.GetGeneration())
	}
	saved, err := os.ReadFile(filepath.Join(h.dir, stateFile))
	if err != nil || !strings.Contains(string(saved), "md5-secret") {
		t.Errorf("the saved state lost the password the agent needs after a restart: %v", err)
	}
	if !proto.Equal(got.GetState().GetBgpPeers()[0], bgpPeerOf("198.51.100.1", func(p *agentv1.BGPPeer) {
		p.Bfd = &agentv1.BFD{Enabled: true, MinRxMs: 100, MinTxMs: 100, Multiplier: 3}
	})) {
		t.Errorf("GetState's peer %v; want the peer as given, without the password", got.GetState().GetBgpPeers()[0])
	}
}
