package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/test/harness"
)

// TrialsEnv sets how many times each fault is repeated: 2 by default (make test), 10 or more
// for the figures of docs/control-plane.md (METALVIP_CP_TRIALS=10).
const TrialsEnv = "METALVIP_CP_TRIALS"

func trials(t *testing.T) int {
	n := 2
	if s := os.Getenv(TrialsEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 100 {
			t.Fatalf("%s=%q: give 1 to 100", TrialsEnv, s)
		}
		n = v
	}
	return n
}

// moveBound is how soon after a fault the VIP must have moved, and after which no request may
// fail (the acceptance's "within 1 s").
const moveBound = time.Second

// observe is how long after each fault the client and the listener are watched.
const observe = 3 * time.Second

// TestTheControlPlaneVIP runs the acceptance on one lab, in order: bootstrap with no API
// server at all, then the VIP following the API servers' health, a killed API server, a dead
// node, a partition, and BGP mode.
func TestTheControlPlaneVIP(t *testing.T) {
	begin := time.Now()
	e := newEnv(t)
	e.writeFiles()
	n := trials(t)
	t.Cleanup(func() {
		if t.Failed() {
			e.dump()
		}
	})
	w := e.watchARP()

	t.Run("the first node brings the VIP up with no API server running at all", func(t *testing.T) {
		start := time.Now()
		e.startAgent("node1")
		took := harness.Eventually(t, 10*time.Second, "node1 answers ARP for the VIP", func() bool { return w.owner() == "node1" })
		var refused bool
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := e.lab.Client.DialTCP(ctx, netip.AddrPortFrom(vip, apiPort).String()); err != nil {
			refused = strings.Contains(err.Error(), "refused")
		}
		if !refused {
			t.Error("something answers on the VIP's port 6443 though no kube-apiserver runs")
		}
		cp := e.controlPlane("node1")
		if !cp.GetBootstrap() || cp.GetApiServerReady() || !cp.GetVip().GetActive() {
			t.Errorf("node1 says %v", cp)
		}
		t.Logf("bootstrap: node1's agent answered for the VIP %s after its start, with no API server anywhere (%s)",
			took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})

	l := e.startLister()
	t.Run("once the API servers run, the VIP follows their health", func(t *testing.T) {
		start := time.Now()
		e.startAgent("node2")
		e.startAgent("node3")
		for _, n := range e.lab.Nodes {
			e.startAPIServer(n.Name)
		}
		e.waitAPIServers(3 * time.Minute)
		t.Logf("three kube-apiservers ready in %s", time.Since(start).Round(time.Second))
		harness.Eventually(t, 30*time.Second, "node1 holds the VIP, its bootstrap over, and the client is served", func() bool {
			cp := e.controlPlane("node1")
			return w.owner() == "node1" && cp.GetApiServerReady() && !cp.GetBootstrap() && len(cp.GetSeen()) == 2 && l.steady(2*time.Second)
		})
	})
	if t.Failed() {
		return
	}

	var apiMoves, apiOutages, nodeMoves, nodeOutages []time.Duration
	for i := range n {
		t.Run(fmt.Sprintf("killing the holder's kube-apiserver moves the VIP within 1 s and no request fails after that (trial %d)", i+1), func(t *testing.T) {
			move, outage := e.fault(t, w, l, "kube-apiserver")
			apiMoves, apiOutages = append(apiMoves, move), append(apiOutages, outage)
		})
	}
	for i := range n {
		t.Run(fmt.Sprintf("the holder's node dying (link down) moves the VIP within 1 s and no request fails after that (trial %d)", i+1), func(t *testing.T) {
			move, outage := e.fault(t, w, l, "node")
			nodeMoves, nodeOutages = append(nodeMoves, move), append(nodeOutages, outage)
		})
	}
	for _, f := range []struct {
		what          string
		moves, outage []time.Duration
	}{{"kube-apiserver killed", apiMoves, apiOutages}, {"node killed (link down)", nodeMoves, nodeOutages}} {
		if len(f.moves) == 0 || len(f.outage) == 0 {
			continue
		}
		m50, m99, mmax := percentiles(f.moves)
		o50, o99, omax := percentiles(f.outage)
		t.Logf("FIGURES %s, %d trials: VIP moved (first ARP answer of the new holder) p50 %s p99 %s max %s; client outage (longest time without a successful answer) p50 %s p99 %s max %s",
			f.what, len(f.moves), ms(m50), ms(m99), ms(mmax), ms(o50), ms(o99), ms(omax))
	}

	t.Run("a partition isolating the holder: within one failover bound exactly one other node answers, and the isolated one stops", func(t *testing.T) {
		e.partition(t, w, l)
	})
	t.Run("standby on the holder (before an upgrade) hands the VIP to the next node while its API server still answers", func(t *testing.T) {
		e.standby(t, w, l)
	})
	l.Stop()

	t.Run("BGP mode: every ready node is a next hop; a stopped API server's next hop leaves within 1 s", func(t *testing.T) {
		for _, n := range e.lab.Nodes {
			e.stopAgent(n.Name)
		}
		e.writeFiles("--mode=BGP", "--bgp-asn=64497", "--bgp-peer="+e.lab.Router.IPv4.String()+",64496")
		for _, n := range e.lab.Nodes {
			e.startAgent(n.Name)
		}
		all := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
		took := harness.Eventually(t, 60*time.Second, "three next hops at the router", func() bool { return slices.Equal(e.lab.NextHops(t, vip.String()), all) })
		t.Logf("BGP: three next hops %s after the agents started", took.Round(time.Millisecond))
		var leaves []time.Duration
		for i := range n {
			victim := e.lab.Nodes[1+i%2]
			harness.Eventually(t, 60*time.Second, "three next hops", func() bool { return slices.Equal(e.lab.NextHops(t, vip.String()), all) })
			e.apiservers[victim.Name].Kill()
			gone := harness.Eventually(t, 10*time.Second, victim.Name+"'s next hop leaves", func() bool {
				return !slices.Contains(e.lab.NextHops(t, vip.String()), victim.IPv4.String())
			})
			leaves = append(leaves, gone)
			t.Logf("trial %d: %s's kube-apiserver killed; its next hop left the router's table %s later; hops now %v", i+1, victim.Name, ms(gone), e.lab.NextHops(t, vip.String()))
			if gone > moveBound {
				t.Errorf("trial %d: the next hop left %s after the kill, over the %s bound", i+1, ms(gone), moveBound)
			}
			if got := e.lab.NextHops(t, vip.String()); len(got) != 2 {
				t.Errorf("trial %d: next hops %v; want the two others", i+1, got)
			}
			e.startAPIServer(victim.Name)
			e.waitAPIServers(3 * time.Minute)
		}
		p50, p99, pmax := percentiles(leaves)
		t.Logf("FIGURES BGP, kube-apiserver killed, %d trials: its next hop gone from the router's kernel p50 %s p99 %s max %s", len(leaves), ms(p50), ms(p99), ms(pmax))
	})
	t.Logf("the control-plane e2e ran %s (%d trials per fault)", time.Since(begin).Round(time.Second), n)
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// fault kills node1's kube-apiserver or its link, checks that another node answered within
// moveBound and that no request started after moveBound failed, restores node1 and waits
// until it holds the VIP again. It returns when the VIP moved and the client's outage.
func (e *env) fault(t *testing.T, w *arpWatch, l *lister, kind string) (move, outage time.Duration) {
	const victim = "node1"
	harness.Eventually(t, 2*time.Minute, "node1 holds the VIP and the client is served", func() bool {
		return w.owner() == victim && l.steady(2*time.Second)
	})
	h := e.node(victim)
	marks := e.logMarks()
	t0 := time.Now()
	switch kind {
	case "kube-apiserver":
		e.apiservers[victim].Kill()
	case "node":
		if _, err := h.Run(context.Background(), "ip", "link", "set", "eth0", "down"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(observe)
	t1 := time.Now()
	holder, _ := w.newHolder(t, t0, t1, victim, "the fault")
	first, _ := w.span(holder, t0, t1)
	move = first.Sub(t0)
	outage, failed, firstErr := l.outage(t0, t1)
	var late []string
	for _, r := range l.between(t0.Add(moveBound), t1) {
		if r.err != nil {
			late = append(late, fmt.Sprintf("%s after the fault: %v", ms(r.start.Sub(t0)), r.err))
		}
	}
	if len(late) > 0 {
		t.Errorf("%d requests started over %s after the fault failed: %s", len(late), moveBound, strings.Join(late, "; "))
	}
	if move <= 0 || move > moveBound {
		t.Errorf("%s answered %s after the fault; want within %s", holder, ms(move), moveBound)
	}
	t.Logf("%s killed: %s answered for the VIP %s later; the client went %s without an answer (%d requests failed; first error: %v)",
		kind, holder, ms(move), ms(outage), failed, firstErr)
	if move > moveBound/2 {
		t.Logf("a slow move: what the agents logged of the control-plane VIP since the fault:\n%s", e.logSince(marks))
	}

	switch kind {
	case "kube-apiserver":
		e.startAPIServer(victim)
	case "node":
		if _, err := h.Run(context.Background(), "ip", "link", "set", "eth0", "up"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Run(context.Background(), "ip", "route", "replace", "default", "via", e.lab.Router.IPv4.String()); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAPIServers(3 * time.Minute)
	return move, outage
}

// partition cuts node1 off from the other nodes (both ways, every packet; the client, the
// router and etcd still reach it, so its API server stays ready), checks that from one
// failover bound on exactly one other node answers and node1 does not, then heals it.
func (e *env) partition(t *testing.T, w *arpWatch, l *lister) {
	const victim = "node1"
	harness.Eventually(t, 2*time.Minute, "node1 holds the VIP and the client is served", func() bool {
		return w.owner() == victim && l.steady(2*time.Second)
	})
	h := e.node(victim)
	others := e.lab.Nodes[1].IPv4.String() + ", " + e.lab.Nodes[2].IPv4.String()
	rules := fmt.Sprintf(`table inet mvpartition {
  chain in { type filter hook input priority 0; ip saddr { %s } drop; }
  chain out { type filter hook output priority 0; ip daddr { %s } drop; }
}
`, others, others)
	file := e.dir + "/partition.nft"
	if err := os.WriteFile(file, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if out, err := h.Run(context.Background(), "nft", "-f", file); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	time.Sleep(observe)
	t1 := time.Now()
	if !e.ready(h) {
		t.Error("node1's API server is not ready during the partition: the test would not show the majority rule")
	}
	holder, after := w.newHolder(t, t0, t1, victim, "the partition")
	_, lastIsolated := w.span(victim, t0, t1)
	firstNew, _ := w.span(holder, t0, t1)
	during := w.answerers(t0, t0.Add(moveBound))
	overlap := max(lastIsolated.Sub(firstNew), 0)
	t.Logf("FIGURES partition: node1 (ready, %q) answered last %s after it, %s first %s after it (both answered for %s); answers in the first %s: %v, after: %v",
		e.controlPlane(victim).GetVip().GetReason(), ms(lastIsolated.Sub(t0)), holder, ms(firstNew.Sub(t0)), ms(overlap), moveBound, during, after)
	if out, err := h.Run(context.Background(), "nft", "delete", "table", "inet", "mvpartition"); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	healed := time.Now()
	harness.Eventually(t, 30*time.Second, "node1 holds the VIP again once the partition heals", func() bool { return w.owner() == victim })
	t.Logf("partition healed: node1 holds the VIP again %s later", ms(time.Since(healed)))
}

// standby sets standby in node1's file with metalvipctl, as an operator does before upgrading
// it, and measures what the client sees; then turns it off again.
func (e *env) standby(t *testing.T, w *arpWatch, l *lister) {
	const victim = "node1"
	harness.Eventually(t, 2*time.Minute, "node1 holds the VIP and the client is served", func() bool {
		return w.owner() == victim && l.steady(2*time.Second)
	})
	file := e.files + "/" + victim + "/controlplane.yaml"
	set := func(on string) {
		if out, err := exec.Command(ctlBinary, "controlplane", "standby", "--config", file, on).CombinedOutput(); err != nil {
			t.Fatalf("metalvipctl controlplane standby %s: %v\n%s", on, err, out)
		}
	}
	t0 := time.Now()
	set("on")
	took := harness.Eventually(t, 10*time.Second, "another node holds the VIP", func() bool { o := w.owner(); return o != "" && o != victim })
	time.Sleep(observe)
	t1 := time.Now()
	gap, failed, firstErr := l.outage(t0, t1)
	_, lastOld := w.span(victim, t0, t1)
	holder := w.owner()
	firstNew, _ := w.span(holder, t0, t1)
	t.Logf("FIGURES standby: node1 stopped answering ARP %s after the file changed, %s answered %s after it (%s after node1 stopped; both answered for %s); the client went %s without an answer (%d requests failed; first error: %v)",
		ms(lastOld.Sub(t0)), holder, ms(firstNew.Sub(t0)), ms(firstNew.Sub(lastOld)), ms(max(lastOld.Sub(firstNew), 0)), ms(gap), failed, firstErr)
	if took > 5*time.Second {
		t.Errorf("the VIP moved %s after standby; want within 5 s (the file is read every second)", ms(took))
	}
	if cp := e.controlPlane(victim); !strings.Contains(cp.GetVip().GetReason(), "standby") || !cp.GetApiServerReady() {
		t.Errorf("node1 says %v", cp)
	}
	set("off")
	harness.Eventually(t, 30*time.Second, "node1 holds the VIP again after standby off", func() bool { return w.owner() == victim })
}

// logMarks returns how long each agent's log is now.
func (e *env) logMarks() map[string]int {
	out := map[string]int{}
	for n, p := range e.agents {
		out[n] = len(p.Output())
	}
	return out
}

// logSince returns the control-plane lines each agent logged after marks.
func (e *env) logSince(marks map[string]int) string {
	var b strings.Builder
	for _, n := range e.lab.Nodes {
		p := e.agents[n.Name]
		if p == nil {
			continue
		}
		out := p.Output()
		if m := marks[n.Name]; m <= len(out) {
			out = out[m:]
		}
		for line := range strings.SplitSeq(out, "\n") {
			if strings.Contains(line, "Control-plane") {
				b.WriteString(n.Name + ": " + line + "\n")
			}
		}
	}
	return b.String()
}
