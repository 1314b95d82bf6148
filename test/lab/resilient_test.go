package lab

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestAResilientGroupMovesOnlyWhatItMust checks what the drain measurements rely on: the group
// follows the router's route, a weight change moves idle buckets to the next hops that gained
// weight (none away from them), and a next hop that leaves gives away its own buckets alone.
func TestAResilientGroupMovesOnlyWhatItMust(t *testing.T) {
	l := New(t, Options{})
	ctx := context.Background()
	prefix := netip.MustParsePrefix("203.0.113.250/32")
	route := func(weights ...string) {
		t.Helper()
		args := []string{"route", "replace", prefix.String()}
		for i, w := range weights {
			if w != "" {
				args = append(args, "nexthop", "via", l.Nodes[i].IPv4.String(), "dev", "eth0", "weight", w)
			}
		}
		if _, err := l.Router.Run(ctx, "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	route("1", "1", "1")
	r := l.StartResilientECMP(t, prefix, ResilientOptions{Buckets: 64})
	r.WaitHops(t, 3, 10*time.Second)
	snapshot := func() []netip.Addr {
		t.Helper()
		hops, err := r.BucketHops()
		if err != nil {
			t.Fatal(err)
		}
		return hops
	}
	// until waits (at most 10 s) for the buckets to satisfy ok.
	until := func(what string, ok func([]netip.Addr) bool) []netip.Addr {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			hops := snapshot()
			if ok(hops) {
				return hops
			}
			if time.Now().After(deadline) {
				changes, err := r.Changes()
				t.Fatalf("%s: not within 10 s; buckets %v; group changes %v (error %v)", what, hops, changes, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	count := func(hops []netip.Addr, a netip.Addr) int {
		n := 0
		for _, h := range hops {
			if h == a {
				n++
			}
		}
		return n
	}
	n1, n2, n3 := l.Nodes[0].IPv4, l.Nodes[1].IPv4, l.Nodes[2].IPv4
	even := until("every next hop holds a third of the buckets", func(h []netip.Addr) bool {
		return count(h, n1) >= 20 && count(h, n2) >= 20 && count(h, n3) >= 20
	})

	t.Run("a weight change moves idle buckets to the next hops that gained, none away from them", func(t *testing.T) {
		route("1", "49", "49")
		// 64 buckets at weights 1/49/49: node1 keeps about 0.6 of a bucket.
		after := until("node1's idle buckets moved", func(h []netip.Addr) bool { return count(h, n1) <= 1 })
		for i := range even {
			if even[i] != n1 && after[i] != even[i] {
				t.Errorf("bucket %d moved from %s to %s", i, even[i], after[i])
			}
		}
		even = after
	})

	t.Run("a next hop that leaves gives away its own buckets alone", func(t *testing.T) {
		route("1", "", "49")
		after := until("node2's buckets moved", func(h []netip.Addr) bool { return count(h, n2) == 0 })
		for i := range even {
			if even[i] != n2 && after[i] != even[i] {
				t.Errorf("bucket %d moved from %s to %s", i, even[i], after[i])
			}
		}
	})

	if _, err := r.Changes(); err != nil {
		t.Errorf("following the route: %v", err)
	}
}
