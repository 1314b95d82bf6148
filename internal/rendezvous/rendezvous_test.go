package rendezvous

import (
	"net/netip"
	"slices"
	"testing"
)

func TestOwnerSpreadsAndMovesOnlyTheDeadNodesShare(t *testing.T) {
	nodes := []string{"node1", "node2", "node3"}
	owners := map[netip.Addr]string{}
	count := map[string]int{}
	base := netip.MustParseAddr("198.51.100.100")
	a := base
	for range 300 {
		owners[a] = Owner(a, nodes)
		count[owners[a]]++
		a = a.Next()
	}
	for _, n := range nodes {
		if count[n] < 60 || count[n] > 140 {
			t.Errorf("%s owns %d of 300 clients; want about 100 (%v)", n, count[n], count)
		}
	}
	// node2 leaves: only its clients move, over both survivors.
	moved := map[string]int{}
	for c, o := range owners {
		now := Owner(c, []string{"node1", "node3"})
		if o != "node2" && now != o {
			t.Fatalf("client %s moved from %s to %s though %s stayed", c, o, now, o)
		}
		if o == "node2" {
			moved[now]++
		}
	}
	if moved["node1"] == 0 || moved["node3"] == 0 {
		t.Errorf("node2's clients went to %v; want both survivors", moved)
	}
	// Order of members does not matter.
	rev := slices.Clone(nodes)
	slices.Reverse(rev)
	for c, o := range owners {
		if Owner(c, rev) != o {
			t.Fatalf("owner of %s depends on member order", c)
		}
	}
	if Owner(base, nil) != "" {
		t.Error("owner among no members")
	}
}
