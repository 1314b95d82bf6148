package announcer

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDrainsEndTheirDelayOnceAndForgetWhatEnds: a table of observations (seconds after the
// start, which nodes exist and which drain) and what each returns and leaves lingering, with a
// delay of 10 s.
func TestDrainsEndTheirDelayOnceAndForgetWhatEnds(t *testing.T) {
	start := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
	type obs struct {
		at        int      // seconds after start
		nodes     []string // the nodes that exist
		draining  []string
		over      []string // whose delay ended at this observation
		lingering []string // within their delay after it
	}
	for _, tc := range []struct {
		name string
		obs  []obs
	}{
		{"a drain lingers for its delay, then ends once", []obs{
			{0, []string{"a", "b"}, []string{"a"}, nil, []string{"a"}},
			{9, []string{"a", "b"}, []string{"a"}, nil, []string{"a"}},
			{10, []string{"a", "b"}, []string{"a"}, []string{"a"}, nil},
			{11, []string{"a", "b"}, []string{"a"}, nil, nil},
		}},
		{"undrained within its delay: no longer lingering, nothing to end", []obs{
			{0, []string{"a"}, []string{"a"}, nil, []string{"a"}},
			{5, []string{"a"}, nil, nil, nil},
			{20, []string{"a"}, nil, nil, nil},
		}},
		{"drained again: a new delay from then", []obs{
			{0, []string{"a"}, []string{"a"}, nil, []string{"a"}},
			{12, []string{"a"}, []string{"a"}, []string{"a"}, nil},
			{13, []string{"a"}, nil, nil, nil},
			{14, []string{"a"}, []string{"a"}, nil, []string{"a"}},
			{24, []string{"a"}, []string{"a"}, []string{"a"}, nil},
		}},
		{"a node deleted while draining is forgotten", []obs{
			{0, []string{"a", "b"}, []string{"a", "b"}, nil, []string{"a", "b"}},
			{3, []string{"b"}, []string{"b"}, nil, []string{"b"}},
			{4, []string{"a", "b"}, []string{"a", "b"}, nil, []string{"a", "b"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDrains(10*time.Second, func() {})
			defer d.stop()
			for _, o := range tc.obs {
				var nodes []*v1.Node
				for _, n := range o.nodes {
					nodes = append(nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
				}
				now := start.Add(time.Duration(o.at) * time.Second)
				over := d.observe(now, nodes, func(n *v1.Node) bool { return slices.Contains(o.draining, n.Name) })
				slices.Sort(over)
				if !slices.Equal(over, o.over) {
					t.Fatalf("at %ds: over %v, want %v", o.at, over, o.over)
				}
				var lingering []string
				for _, n := range []string{"a", "b"} {
					if d.lingering(n, now) {
						lingering = append(lingering, n)
					}
				}
				if !slices.Equal(lingering, o.lingering) {
					t.Fatalf("at %ds: lingering %v, want %v", o.at, lingering, o.lingering)
				}
			}
		})
	}
}
