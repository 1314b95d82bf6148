package nodeagent

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// BenchmarkApplyOneMoreVIP is an Apply during a burst of new Services: the state of a node
// holding n L2 VIPs, sent whole, differs from the one before by one VIP. The agent checks,
// persists and applies it (no speakers here: the decisions, the checks and the state file).
func BenchmarkApplyOneMoreVIP(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("vips=%d", n), func(b *testing.B) {
			a, err := New(context.Background(), Options{Node: "node-a", StateDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = a.Close(context.Background()) }()
			var anns []*agentv1.Announcement
			for i := range n + 1 {
				ip := netip.AddrFrom4([4]byte{10, 128, byte(i >> 8), byte(i)})
				anns = append(anns, l2VIP(ip.String(), "node-a"))
			}
			gen := uint64(0)
			b.ReportAllocs()
			for b.Loop() {
				gen++
				st := state(1, gen, anns[:n+int(gen%2)]...)
				if _, err := a.Apply(context.Background(), &agentv1.ApplyRequest{State: st}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
