package nodeagent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"

	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
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

// toggledLiveness says one peer is alive or dead, as the benchmark sets it.
type toggledLiveness struct {
	fakeLiveness
	mu   sync.Mutex
	dead bool
}

// View says every peer is dead or alive, and sees this node when alive.
func (f *toggledLiveness) View() failover.View {
	v := f.fakeLiveness.View()
	f.mu.Lock()
	defer f.mu.Unlock()
	for n := range v.Peers {
		v.Peers[n] = failover.PeerView{Alive: !f.dead, Sees: !f.dead}
	}
	return v
}

// toggle turns the peers dead or alive and tells the agent, as a monitor would.
func (f *toggledLiveness) toggle() {
	f.mu.Lock()
	f.dead = !f.dead
	f.mu.Unlock()
	f.fakeLiveness.mu.Lock()
	f.seq++
	f.fakeLiveness.mu.Unlock()
	f.cfg.OnChange(f.View())
}

// discardARP is an ARP connection that sends nowhere and receives nothing until closed.
type discardARP struct{ closed chan struct{} }

func (d *discardARP) Read() (*arp.Packet, *ethernet.Frame, error) {
	<-d.closed
	return nil, nil, net.ErrClosed
}
func (d *discardARP) WriteTo(*arp.Packet, net.HardwareAddr) error { return nil }
func (d *discardARP) Close() error                                { close(d.closed); return nil }

// BenchmarkALivenessChangeMovesAThousandVIPs is what a node does when the first candidate of
// 1,000 L2 VIPs it stands by for dies, and again when it comes back: decide every VIP, set the
// speaker (real, on a connection that sends nowhere), report the changes.
func BenchmarkALivenessChangeMovesAThousandVIPs(b *testing.B) {
	live := &toggledLiveness{}
	speaker := l2.New(l2.Options{
		OpenARP: func(*net.Interface) (l2.ARPConn, error) { return &discardARP{closed: make(chan struct{})}, nil },
		LookupInterface: func(name string) (*net.Interface, error) {
			return &net.Interface{Name: name, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}, nil
		},
	})
	a, err := New(context.Background(), Options{Node: "node-a", Interfaces: []string{"eth0"}, L2: speaker, MACFilter: noMACFilter{},
		NewLiveness: func(c failover.Config) (Liveness, error) { live.cfg = c; return live, nil }})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = a.Close(context.Background()) }()
	st := state(1, 1)
	st.Bgp, st.BgpPeers = nil, nil
	for i := range 1000 {
		ip := netip.AddrFrom4([4]byte{10, 128, byte(i >> 8), byte(i)})
		st.Announcements = append(st.Announcements, withCandidates(ip.String(), "node-b", "node-a"))
	}
	st.HeartbeatPeers = []*agentv1.HeartbeatPeer{{Node: "node-b", Address: "198.51.100.12", PublicKeys: [][]byte{a.identity.PublicKeys()[0]}}}
	if _, err := a.Apply(context.Background(), &agentv1.ApplyRequest{State: st}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		live.toggle()
	}
}

type noMACFilter struct{}

func (noMACFilter) Set(map[string][]net.HardwareAddr) error { return nil }
func (noMACFilter) Check() error                            { return nil }
func (noMACFilter) Close() error                            { return nil }
