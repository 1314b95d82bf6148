package announcer

import (
	"net/netip"
	"slices"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestRefusalsAreWhatEachAgentLastSaid: reports from the agents, in order, and after each what
// it touched, who refuses each address, and whether the next report of none could change
// anything.
func TestRefusalsAreWhatEachAgentLastSaid(t *testing.T) {
	a, b := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	vip := func(ip netip.Addr) *agentv1.Refusal {
		return &agentv1.Refusal{Kind: agentv1.Refusal_KIND_ANNOUNCEMENT, Key: ip.String(), Field: "l2.interfaces", Reason: "no such interface"}
	}
	peer := &agentv1.Refusal{Kind: agentv1.Refusal_KIND_BGP_PEER, Key: "198.51.100.1", Field: "password", Reason: "empty"}
	bad := &agentv1.Refusal{Kind: agentv1.Refusal_KIND_ANNOUNCEMENT, Key: "not an address"}
	type report struct {
		node       string
		rf         refusal
		touched    []netip.Addr
		byA, byB   []string
		noneChange bool // a report of nothing from node may change something after this one
	}
	for _, tc := range []struct {
		name    string
		reports []report
	}{
		{"none after none changes nothing", []report{
			{"node1", refusal{}, nil, nil, nil, false},
		}},
		{"a refusal, then it ends", []report{
			{"node1", refusal{items: []*agentv1.Refusal{vip(a)}}, []netip.Addr{a}, []string{"node1"}, nil, true},
			{"node1", refusal{}, []netip.Addr{a}, nil, nil, false},
		}},
		{"two nodes refuse one address; one stops", []report{
			{"node2", refusal{items: []*agentv1.Refusal{vip(a)}}, []netip.Addr{a}, []string{"node2"}, nil, true},
			{"node1", refusal{items: []*agentv1.Refusal{vip(a), vip(b)}}, []netip.Addr{a, b}, []string{"node1", "node2"}, []string{"node1"}, true},
			{"node2", refusal{}, []netip.Addr{a}, []string{"node1"}, []string{"node1"}, false},
		}},
		{"another address in place of one: both touched", []report{
			{"node1", refusal{items: []*agentv1.Refusal{vip(a)}}, []netip.Addr{a}, []string{"node1"}, nil, true},
			{"node1", refusal{items: []*agentv1.Refusal{vip(b)}}, []netip.Addr{a, b}, nil, []string{"node1"}, true},
		}},
		{"a peer or a whole state refused touches no address, but counts", []report{
			{"node1", refusal{items: []*agentv1.Refusal{peer}}, nil, nil, nil, true},
			{"node1", refusal{whole: "term 3 is below 4"}, nil, nil, nil, true},
			{"node1", refusal{}, nil, nil, nil, false},
		}},
		{"a key that is no address is left out", []report{
			{"node1", refusal{items: []*agentv1.Refusal{bad}}, nil, nil, nil, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRefusals()
			for i, rep := range tc.reports {
				if got := r.record(rep.node, rep.rf); !slices.Equal(got, rep.touched) {
					t.Fatalf("report %d: touched %v, want %v", i, got, rep.touched)
				}
				if got := r.refusedBy(a); !slices.Equal(got, rep.byA) {
					t.Fatalf("report %d: %s refused by %v, want %v", i, a, got, rep.byA)
				}
				if got := r.refusedBy(b); !slices.Equal(got, rep.byB) {
					t.Fatalf("report %d: %s refused by %v, want %v", i, b, got, rep.byB)
				}
				if got := r.mayChange(map[string]refusal{rep.node: {}}); got != rep.noneChange {
					t.Fatalf("report %d: a report of nothing from %s may change something: %v, want %v", i, rep.node, got, rep.noneChange)
				}
			}
		})
	}
}
