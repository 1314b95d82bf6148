package nodeagent

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"net/netip"
	"testing"

	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// BenchmarkCheckStateWithHeartbeatPeers is the check of a state naming 200 heartbeat peers,
// each with two keys (a node's current and next), as a node of a large cluster gets in every
// Apply: the peers' keys are the same from one state to the next.
func BenchmarkCheckStateWithHeartbeatPeers(b *testing.B) {
	st := state(1, 1, withCandidates("203.0.113.10", "node-a", "node-b"))
	for i := range 200 {
		hp := &agentv1.HeartbeatPeer{Node: fmt.Sprintf("node-%d", i), Address: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}).String()}
		for range 2 {
			k, err := ecdh.X25519().GenerateKey(rand.Reader)
			if err != nil {
				b.Fatal(err)
			}
			hp.PublicKeys = append(hp.PublicKeys, k.PublicKey().Bytes())
		}
		st.HeartbeatPeers = append(st.HeartbeatPeers, hp)
	}
	b.ReportAllocs()
	for b.Loop() {
		if c := checkItems(st); len(c.hbPeers) != 200 || len(c.problems) != 0 {
			b.Fatalf("%d peers, problems %v", len(c.hbPeers), c.problems)
		}
	}
}
