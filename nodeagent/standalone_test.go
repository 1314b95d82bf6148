package nodeagent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/controlplane"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// liveSet is LivenessFacts from two sets.
type liveSet struct{ alive, sees map[string]bool }

func (l liveSet) Alive(n string) bool { return l.alive[n] }
func (l liveSet) Sees(n string) bool  { return l.sees[n] }

func TestTheControlPlaneRulesDecideInOrder(t *testing.T) {
	ranked := []string{"cp1", "cp2", "cp3"}
	everyone := liveSet{alive: map[string]bool{"cp1": true, "cp2": true, "cp3": true}, sees: map[string]bool{"cp1": true, "cp2": true, "cp3": true}}
	for _, tc := range []struct {
		name      string
		f         cpFacts
		eligible  bool
		active    bool
		reasonHas string
	}{
		{"a standby node never holds the VIP", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, ready: true, standby: true, seen: 2, cands: everyone}, false, false, "standby"},
		{"a node whose API server is not ready never holds it", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, detail: "connection refused", seen: 2, cands: everyone}, false, false, "not ready: connection refused"},
		{"bootstrap lets the first node hold it before its API server is ready", cpFacts{self: "cp1", ranked: []string{"cp1"}, mode: controlplane.ModeL2, healthWaived: true}, true, true, "bootstrap"},
		{"a ready node without a majority never holds it", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, ready: true, seen: 0, cands: everyone}, false, false, "sees 1 of 3"},
		{"bootstrap lets the first node hold it without a majority", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, ready: true, quorumWaived: true, cands: liveSet{}}, true, true, "without a majority"},
		{"a ready node with a majority and the best rank holds it", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, ready: true, seen: 1, cands: everyone}, true, true, "first candidate"},
		{"a ready node below a live better one stands by", cpFacts{self: "cp2", ranked: ranked, mode: controlplane.ModeL2, ready: true, seen: 2, cands: everyone}, true, false, "cp1 is alive"},
		{"a ready node takes over only once the lower one released", cpFacts{self: "cp1", ranked: ranked, mode: controlplane.ModeL2, ready: true, seen: 2,
			cands: liveSet{alive: map[string]bool{"cp2": true}, sees: map[string]bool{}}}, true, false, "waiting for cp2"},
		{"in BGP mode every ready node advertises", cpFacts{self: "cp3", ranked: ranked, mode: controlplane.ModeBGP, ready: true}, true, true, "anycast"},
		{"in BGP mode a node that is not ready does not", cpFacts{self: "cp3", ranked: ranked, mode: controlplane.ModeBGP, detail: "500"}, false, false, "not ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideControlPlane(tc.f)
			if d.Eligible != tc.eligible || d.Active != tc.active || !strings.Contains(d.Reason, tc.reasonHas) {
				t.Errorf("decision %+v; want eligible %v, active %v, a reason with %q", d, tc.eligible, tc.active, tc.reasonHas)
			}
		})
	}
}

// TestAtMostOneSideOfAPartitionMayHoldTheVIP: split the control-plane nodes into groups that
// see only their own members; whatever the health of each node, nodes of at most one group are
// eligible (without bootstrap).
func TestAtMostOneSideOfAPartitionMayHoldTheVIP(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 9).Draw(t, "nodes")
		var ranked []string
		group := map[string]int{}
		for i := range n {
			name := fmt.Sprintf("cp%d", i)
			ranked = append(ranked, name)
			group[name] = rapid.IntRange(0, 3).Draw(t, name+" group")
		}
		eligibleGroups := map[int]bool{}
		for _, self := range ranked {
			seen := 0
			for _, o := range ranked {
				if o != self && group[o] == group[self] {
					seen++
				}
			}
			d := decideControlPlane(cpFacts{self: self, ranked: ranked, mode: controlplane.ModeL2,
				ready: rapid.Bool().Draw(t, self+" ready"), seen: seen, cands: liveSet{}})
			if d.Eligible {
				eligibleGroups[group[self]] = true
			}
		}
		if len(eligibleGroups) > 1 {
			t.Fatalf("nodes of %d groups may hold the VIP: %v", len(eligibleGroups), group)
		}
	})
}

// cpNode is one in-process control-plane node: an agent with a fake speaker, real heartbeats
// on loopback, and an API server check the test turns on and off.
type cpNode struct {
	name  string
	file  string
	state string
	l2    *fakeL2
	ready atomic.Bool
	agent *Agent
}

func (n *cpNode) holds(vip netip.Addr) bool {
	return slices.ContainsFunc(n.l2.last(), func(v l2.VIP) bool { return v.Addr == vip })
}

const cpTestVIP = "203.0.113.10"

// cpFile writes the file every node shares, for self, with extra lines.
func cpFile(nodes []*cpNode, keys map[string][]byte, self *cpNode, extra string) {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\nnode: %s\nvip: %s\nmode: L2\ninterfaces: [eth0]\n", controlplane.APIVersion, controlplane.Kind, self.name, cpTestVIP)
	b.WriteString("heartbeat: {interval: 20ms, misses: 3}\napiServer: {interval: 20ms, rise: 2, fall: 2}\nnodes:\n")
	for i, n := range nodes {
		fmt.Fprintf(&b, "- {name: %s, address: 127.0.0.%d, heartbeatKey: %q}\n", n.name, 41+i, base64.StdEncoding.EncodeToString(keys[n.name]))
	}
	b.WriteString(extra)
	if err := os.WriteFile(self.file, []byte(b.String()), 0o600); err != nil {
		panic(err)
	}
}

func startCPNodes(t *testing.T, count int, bootstrap string) []*cpNode {
	t.Helper()
	var nodes []*cpNode
	keys := map[string][]byte{}
	for i := range count {
		dir := t.TempDir()
		n := &cpNode{name: fmt.Sprintf("cp%d", i+1), file: filepath.Join(dir, "controlplane.yaml"), state: filepath.Join(dir, "state"), l2: &fakeL2{}}
		key, err := ControlPlaneKey(n.state)
		if err != nil {
			t.Fatal(err)
		}
		keys[n.name] = key
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		extra := ""
		if n.name == bootstrap {
			extra = "bootstrap: true\n"
		}
		cpFile(nodes, keys, n, extra)
	}
	for _, n := range nodes {
		cp, err := NewControlPlane(ControlPlaneOptions{File: n.file, StateDir: n.state, Reload: 20 * time.Millisecond,
			Check: func(context.Context) error {
				if n.ready.Load() {
					return nil
				}
				return errors.New("connection refused")
			}})
		if err != nil {
			t.Fatal(err)
		}
		n.agent, err = New(context.Background(), Options{Node: n.name, StateDir: n.state, L2: n.l2, ControlPlane: cp})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.agent.Close(context.Background()) })
	}
	return nodes
}

// holders returns the nodes that answer for the VIP, once the answer has held for 200 ms (ten
// heartbeats), or fails the test after 10 s.
func holders(t *testing.T, nodes []*cpNode, want ...string) {
	t.Helper()
	vip := netip.MustParseAddr(cpTestVIP)
	deadline := time.Now().Add(10 * time.Second)
	var stableSince time.Time
	var got []string
	for time.Now().Before(deadline) {
		var now []string
		for _, n := range nodes {
			if n.holds(vip) {
				now = append(now, n.name)
			}
		}
		if !slices.Equal(now, got) {
			got, stableSince = now, time.Now()
		}
		if slices.Equal(got, want) && time.Since(stableSince) >= 200*time.Millisecond {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	var why []string
	for _, n := range nodes {
		st, _ := n.agent.GetState(context.Background(), &agentv1.GetStateRequest{})
		why = append(why, n.name+": "+st.GetControlPlane().GetVip().GetReason())
	}
	t.Fatalf("the VIP is held by %v, want %v:\n%s", got, want, strings.Join(why, "\n"))
}

func TestTheControlPlaneVIPFollowsHealthAndTheMajority(t *testing.T) {
	nodes := startCPNodes(t, 3, "")
	cp1, cp2, cp3 := nodes[0], nodes[1], nodes[2]
	t.Run("no API server ready: nobody holds it", func(t *testing.T) {
		holders(t, nodes)
	})
	t.Run("every API server ready: the best-ranked node holds it", func(t *testing.T) {
		for _, n := range nodes {
			n.ready.Store(true)
		}
		holders(t, nodes, "cp1")
	})
	t.Run("the holder's API server fails: the next node takes it", func(t *testing.T) {
		cp1.ready.Store(false)
		holders(t, nodes, "cp2")
	})
	t.Run("it comes back: it takes the VIP back", func(t *testing.T) {
		cp1.ready.Store(true)
		holders(t, nodes, "cp1")
	})
	t.Run("two API servers fail: the last ready node keeps it, the nodes still make a majority", func(t *testing.T) {
		cp2.ready.Store(false)
		cp3.ready.Store(false)
		holders(t, nodes, "cp1")
		cp2.ready.Store(true)
		cp3.ready.Store(true)
	})
	t.Run("the holder is set to standby in its file: the VIP moves", func(t *testing.T) {
		data, err := os.ReadFile(cp1.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cp1.file, append(data, "standby: true\n"...), 0o600); err != nil {
			t.Fatal(err)
		}
		holders(t, nodes, "cp2")
		st, _ := cp1.agent.GetState(context.Background(), &agentv1.GetStateRequest{})
		if r := st.GetControlPlane().GetVip().GetReason(); !strings.Contains(r, "standby") {
			t.Errorf("cp1 says %q", r)
		}
	})
	t.Run("a broken file is refused and changes nothing", func(t *testing.T) {
		if err := os.WriteFile(cp2.file, []byte("vip: [\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, _ := cp2.agent.GetState(context.Background(), &agentv1.GetStateRequest{})
			if p := st.GetControlPlane().GetProblems(); len(p) == 1 && strings.Contains(p[0], "refused") && strings.Contains(p[0], "still using") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cp2 does not report the broken file: %v", st.GetControlPlane())
			}
			time.Sleep(20 * time.Millisecond)
		}
		holders(t, nodes, "cp2")
	})
	t.Run("two nodes gone: the last one has no majority and lets go", func(t *testing.T) {
		_ = cp1.agent.Close(context.Background())
		_ = cp3.agent.Close(context.Background())
		holders(t, nodes[1:2])
		st, _ := cp2.agent.GetState(context.Background(), &agentv1.GetStateRequest{})
		if r := st.GetControlPlane().GetVip().GetReason(); !strings.Contains(r, "sees 1 of 3") {
			t.Errorf("cp2 says %q", r)
		}
	})
}

func TestTheFirstNodeBootstrapsWithoutAnAPIServerThenFollowsHealth(t *testing.T) {
	nodes := startCPNodes(t, 1, "cp1")
	holders(t, nodes, "cp1")
	st, _ := nodes[0].agent.GetState(context.Background(), &agentv1.GetStateRequest{})
	if cp := st.GetControlPlane(); !cp.GetBootstrap() || cp.GetApiServerReady() || !strings.Contains(cp.GetVip().GetReason(), "bootstrap") {
		t.Errorf("bootstrap status %v", cp)
	}
	nodes[0].ready.Store(true)
	holders(t, nodes, "cp1")
	nodes[0].ready.Store(false)
	holders(t, nodes) // bootstrap is over: it follows health
	// And it stays over across a restart.
	_ = nodes[0].agent.Close(context.Background())
	cp, err := NewControlPlane(ControlPlaneOptions{File: nodes[0].file, StateDir: nodes[0].state, Check: func(context.Context) error { return errors.New("down") }})
	if err != nil {
		t.Fatal(err)
	}
	nodes[0].l2 = &fakeL2{}
	a, err := New(context.Background(), Options{Node: "cp1", StateDir: nodes[0].state, L2: nodes[0].l2, ControlPlane: cp})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	nodes[0].agent = a
	holders(t, nodes)
}

func TestAFileWithAnotherKeyForThisNodeIsRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	n := &cpNode{name: "cp1", file: filepath.Join(dir, "f.yaml")}
	other, _ := base64.StdEncoding.DecodeString("W4Cb7PBXxJ5l3gMIKevoZUv8/t+0AMwmeRAKGu6yOnw=")
	cpFile([]*cpNode{n}, map[string][]byte{"cp1": other}, n, "")
	_, err := NewControlPlane(ControlPlaneOptions{File: n.file, StateDir: filepath.Join(dir, "state")})
	if err == nil || !strings.Contains(err.Error(), "not this node's key") {
		t.Errorf("NewControlPlane = %v", err)
	}
}

// TestTheTwoSourcesStayApart: the CCM's Apply neither takes nor removes the control-plane
// VIP, and the control-plane VIP coming and going touches no Service VIP; GetState shows each
// in its place.
func TestTheTwoSourcesStayApart(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "controlplane.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: metalvip.io/v1alpha1\nkind: ControlPlane\nnode: node-a\nvip: "+cpTestVIP+
		"\nmode: L2\nnodes: [{name: node-a, address: 198.51.100.11}]\napiServer: {interval: 20ms, rise: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	var down atomic.Bool
	cp, err := NewControlPlane(ControlPlaneOptions{File: file, StateDir: stateDir, Check: func(context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := serve(t, stateDir, func(o *Options) { o.ControlPlane = cp })
	c := h.ccm(t)
	vip, service := netip.MustParseAddr(cpTestVIP), netip.MustParseAddr("203.0.113.50")
	answers := func() []netip.Addr {
		var out []netip.Addr
		for _, v := range h.l2.last() {
			out = append(out, v.Addr)
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return out
	}
	waitFor := func(what string, want ...netip.Addr) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !slices.Equal(answers(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the speaker answers %v, want %v", what, answers(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("before any Apply", vip)

	resp, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 1, l2VIP(service.String(), "node-a"), l2VIP(vip.String(), "node-a"))})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRefused()) != 1 || resp.GetRefused()[0].GetField() != "announcements[1].vip" || !strings.Contains(resp.GetRefused()[0].GetReason(), "control-plane VIP") {
		t.Errorf("refused %v; want the control-plane VIP refused alone", resp.GetRefused())
	}
	waitFor("after the CCM's state", vip, service)
	st, err := c.GetState(ctx(t), &agentv1.GetStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetAnnounced()) != 1 || st.GetAnnounced()[0].GetVip() != service.String() {
		t.Errorf("announced %v; want the Service VIP alone", st.GetAnnounced())
	}
	if v := st.GetControlPlane().GetVip(); v.GetVip() != vip.String() || !v.GetActive() || st.GetControlPlane().GetConfigFile() != file {
		t.Errorf("control_plane %v", st.GetControlPlane())
	}

	down.Store(true)
	waitFor("the file's VIP let go, the Service's kept", service)
	down.Store(false)
	waitFor("the file's VIP back, the Service's kept", vip, service)

	if _, err := c.Apply(ctx(t), &agentv1.ApplyRequest{State: state(1, 2)}); err != nil {
		t.Fatal(err)
	}
	waitFor("after the CCM removed everything", vip)
}

// TestInBGPModeTheVIPIsAdvertisedWhileTheAPIServerIsReady: the file's routers get sessions at
// once, with the file's ASN; the /32 comes and goes with readiness.
func TestInBGPModeTheVIPIsAdvertisedWhileTheAPIServerIsReady(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "controlplane.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: metalvip.io/v1alpha1\nkind: ControlPlane\nnode: node-a\nvip: "+cpTestVIP+
		"\nmode: BGP\nnodes: [{name: node-a, address: 198.51.100.11}, {name: node-b, address: 198.51.100.12}]\n"+
		"apiServer: {interval: 20ms, rise: 1, fall: 1}\nbgp: {asn: 64497, peers: [{address: 198.51.100.1, peerASN: 64496}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	cp, err := NewControlPlane(ControlPlaneOptions{File: file, StateDir: filepath.Join(dir, "state"), Check: func(context.Context) error {
		if ready.Load() {
			return nil
		}
		return errors.New("503")
	}})
	if err != nil {
		t.Fatal(err)
	}
	speaker := &fakeBGP{}
	var cfg bgp.Config
	a, err := New(context.Background(), Options{Node: "node-a", StateDir: filepath.Join(dir, "state"), L2: &fakeL2{},
		RouterID: netip.MustParseAddr("198.51.100.11"),
		NewBGP:   func(_ context.Context, c bgp.Config) (BGP, error) { cfg = c; return speaker, nil }, ControlPlane: cp})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	advertised := func() bool {
		speaker.mu.Lock()
		defer speaker.mu.Unlock()
		return slices.ContainsFunc(speaker.routes, func(r bgp.Route) bool { return r.Prefix == netip.MustParsePrefix(cpTestVIP+"/32") })
	}
	wait := func(what string, want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for advertised() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: advertised %v", what, !want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ready.Store(true)
	wait("ready", true)
	speaker.mu.Lock()
	peers := slices.Clone(speaker.peers)
	speaker.mu.Unlock()
	if cfg.ASN != 64497 || len(peers) != 1 || peers[0].Address != netip.MustParseAddr("198.51.100.1") {
		t.Errorf("speaker ASN %d, peers %+v; want the file's", cfg.ASN, peers)
	}
	ready.Store(false)
	wait("not ready", false)
	ready.Store(true)
	wait("ready again", true)
}
