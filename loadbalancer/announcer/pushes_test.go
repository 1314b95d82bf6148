package announcer

import (
	"slices"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// TestANodeIsPushedOnlyWhatChanged: a table of rebuilt states, in order, and whether each is
// pushed, without the rest of the announcer.
func TestANodeIsPushedOnlyWhatChanged(t *testing.T) {
	head := func(term uint64) *agentv1.DesiredState { return &agentv1.DesiredState{Term: term} }
	type step struct {
		node    string
		head    *agentv1.DesiredState
		version uint64
		due     bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a node's first state", []step{{"node1", head(1), 0, true}}},
		{"rebuilt the same: not again", []step{{"node1", head(1), 3, true}, {"node1", head(1), 3, false}}},
		{"a rebuilt equal head (another object) is the same", []step{{"node1", head(1), 3, true}, {"node1", head(1), 3, false}, {"node1", head(1), 3, false}}},
		{"its announcements changed", []step{{"node1", head(1), 3, true}, {"node1", head(1), 4, true}, {"node1", head(1), 4, false}}},
		{"its head changed", []step{{"node1", head(1), 3, true}, {"node1", head(2), 3, true}}},
		{"nodes apart", []step{{"node1", head(1), 3, true}, {"node2", head(1), 3, true}, {"node1", head(1), 3, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pushes{}
			for i, s := range tc.steps {
				if got := p.due(s.node, s.head, s.version); got != s.due {
					t.Errorf("step %d (%s, term %d, version %d): pushed %v, want %v", i, s.node, s.head.GetTerm(), s.version, got, s.due)
				}
			}
		})
	}
	t.Run("a node gone is forgotten, and pushed again when it comes back", func(t *testing.T) {
		p := pushes{}
		p.due("node1", head(1), 1)
		p.due("node2", head(1), 1)
		gone := p.forget(func(n string) bool { return n == "node1" })
		if !slices.Equal(gone, []string{"node2"}) {
			t.Errorf("forgot %v, want [node2]", gone)
		}
		if !p.due("node2", head(1), 1) || p.due("node1", head(1), 1) {
			t.Errorf("after node2 left: node2 not pushed again, or node1 pushed again")
		}
	})
}
