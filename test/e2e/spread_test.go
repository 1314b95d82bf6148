package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// A Service with metalvip.io/vip-count 3 over three nodes gets three addresses, answered by
// three distinct nodes; each survives its node's death. With four addresses over three nodes,
// an Event says two share a node.
func TestSeveralVIPsOnDistinctNodes(t *testing.T) {
	c := newCluster(t)
	vips := c.ServiceIPs("multi", 3, cluster.Annotate(annotation.VIPCount, "3"))
	distinct := func() bool {
		owners := cluster.ValuesOf(c.Owners(vips))
		slices.Sort(owners)
		return owners[0] != "" && len(slices.Compact(owners)) == 3
	}
	harness.Eventually(t, 30*time.Second, "three nodes answer the three addresses", distinct)
	t.Logf("owners %v", c.Owners(vips))
	kc := c.Srv.Kubeconfig(t, nil)
	harness.Eventually(t, 30*time.Second, "metalvipctl status names each address's node", func() bool {
		line := lineWith(ctlStatus(t, kc), c.NS+"/multi ")
		for _, v := range vips {
			if !strings.Contains(line, v.String()+": "+c.Owner(v)) {
				return false
			}
		}
		return true
	})
	for _, vip := range vips {
		victim := c.Owner(vip)
		d := c.Failover(vip, victim)
		t.Logf("%s: %s died, outage %s, %s answers now", vip, victim, d.Round(time.Millisecond), c.Owner(vip))
		c.Revive(victim)
		// The returning node takes one address back: they are on three nodes again.
		harness.Eventually(t, 60*time.Second, "the addresses spread over three nodes again", distinct)
	}

	four := c.ServiceIPs("four", 4, cluster.Annotate(annotation.VIPCount, "4"))
	harness.Eventually(t, 30*time.Second, "an Event says two addresses share a node", func() bool {
		return strings.Contains(c.Events("four", "VIPsShareNodes"), "4 addresses on 3 nodes")
	})
	owners := cluster.ValuesOf(c.Owners(four))
	slices.Sort(owners)
	if len(slices.Compact(owners)) != 3 {
		t.Errorf("four addresses answered by %v; want all three nodes", cluster.ValuesOf(c.Owners(four)))
	}
}

// A per-client VIP with three candidates and 30 clients on the segment: every client is
// answered by exactly one node, each node by 5 to 15 of them. A node dies: the survivors tell
// its clients at once (targeted replies) and nobody else moves. It returns: only the clients
// that hash to it move back.
func TestPerClientSpreading(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary, ClientAddrs: 29})
	pool := c.PerClientPool("pc")
	vip := c.Service("spread", cluster.InPool(pool))
	clients := c.NewClients(c.ClientAddrs())

	// Every client answered by exactly one node; shares of 5 to 15.
	var owners map[netip.Addr]string
	harness.Eventually(t, 30*time.Second, "every client answered by exactly one node", func() bool {
		var ok bool
		owners, ok = clients.Owners(vip, 300*time.Millisecond)
		return ok
	})
	share := cluster.Shares(owners)
	t.Logf("clients per node: %v", share)
	for _, n := range []string{"node1", "node2", "node3"} {
		if share[n] < 5 || share[n] > 15 {
			t.Errorf("%s answers %d of 30 clients; want 5 to 15 (%v)", n, share[n], share)
		}
	}

	// Visible: each node's share in its agent's state, and all three in metalvipctl status.
	for _, h := range c.Lab.Nodes {
		out, err := h.Run(t.Context(), ctlBinary, "agent", h.Name, "--address", h.IPv4.String(),
			"--tls-ca", filepath.Join(c.PKI, "ca.crt"), "--tls-cert", filepath.Join(c.PKI, "ccm.crt"), "--tls-key", filepath.Join(c.PKI, "ccm.key"))
		if err != nil {
			t.Fatalf("metalvipctl agent %s: %v\n%s", h.Name, err, out)
		}
		line := lineWith(string(out), vip.String())
		if want := fmt.Sprintf("answers %d of 30 seen", share[h.Name]); !strings.Contains(line, "L2 per client") || !strings.Contains(line, want) {
			t.Errorf("metalvipctl agent %s shows %q for %s; want L2 per client, %q", h.Name, line, vip, want)
		}
		if h.Name == "node1" {
			t.Logf("metalvipctl agent node1:\n%s", out)
		}
	}
	kc := c.Srv.Kubeconfig(t, nil)
	harness.Eventually(t, 30*time.Second, "metalvipctl status names the three nodes, per client", func() bool {
		line := lineWith(ctlStatus(t, kc), c.NS+"/spread ")
		return strings.Contains(line, "node1, node2, node3 (per client)")
	})

	// The node with the most clients dies and returns; then another does, so that a node
	// that restarted is among the survivors (it learnt the clients anew).
	victim := "node1"
	for n, k := range share {
		if k > share[victim] || k == share[victim] && n < victim {
			victim = n
		}
	}
	second := "node1"
	if victim == "node1" {
		second = "node2"
	}
	for _, victim := range []string{victim, second} {
		killAndRevive(t, c, clients, vip, owners, victim)
	}
}

// killAndRevive kills victim, checks that the survivors tell each of its clients at once and
// that nobody else moves, revives it and checks that its clients, and only those, move back.
func killAndRevive(t *testing.T, c *cluster.Cluster, clients *cluster.Clients, vip netip.Addr, owners map[netip.Addr]string, victim string) {
	t.Helper()
	moved := cluster.ClientsOf(owners, victim)
	killed := time.Now()
	c.Kill(victim)
	// The survivors tell each of the victim's clients, unasked.
	var told map[netip.Addr]time.Time
	harness.Eventually(t, 5*time.Second, "every client of the dead "+victim+" told by a survivor", func() bool {
		told = clients.Told(vip, killed, victim, moved)
		return len(told) == len(moved)
	})
	var outages []time.Duration
	for _, at := range told {
		outages = append(outages, at.Sub(killed))
	}
	slices.Sort(outages)
	t.Logf("%s died: its %d clients told by the survivors after %s (first) to %s (last)", victim, len(moved),
		outages[0].Round(time.Millisecond), outages[len(outages)-1].Round(time.Millisecond))
	after := clients.Answerers(vip, 300*time.Millisecond)
	for a, n := range owners {
		got := after[a]
		switch {
		case len(got) != 1:
			t.Errorf("after %s died, client %s answered by %v; want exactly one node", victim, a, got)
		case n != victim && got[0] != n:
			t.Errorf("client %s moved from %s to %s though %s is alive", a, n, got[0], n)
		case n == victim && got[0] == victim:
			t.Errorf("client %s still answered by the dead %s", a, victim)
		}
	}

	// It returns: its clients, and only those, move back.
	c.Revive(victim)
	harness.Eventually(t, 30*time.Second, victim+" answers its clients again, and nobody else moved", func() bool {
		back := clients.Answerers(vip, 300*time.Millisecond)
		for a, n := range owners {
			if len(back[a]) != 1 || back[a][0] != n {
				return false
			}
		}
		return true
	})
}
