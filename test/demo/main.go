// Command demo is `make demo`: it brings metalvip up whole in a network lab on this machine (a
// real kube-apiserver, the CCM, an agent on each of three node namespaces, FRR as the site's
// router, a client on the segment and one behind the router, an HTTP server on every node that
// answers with its name), creates pools and Services, shows who announces what and who
// answers, kills the owner of an L2 address and shows the outage a client saw, then tears it
// all down. KEEP=1 leaves it up until Ctrl-C. Run as root.
package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/metalvip/metalvip/internal/annotation"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

func main() {
	// Ctrl-C tears the lab down too.
	m := harness.Program("metalvip-demo", "make demo builds network namespaces: run it as root (sudo make demo)")
	defer m.Close()

	harness.Step("building the CCM, the agent and metalvipctl")
	ccm, agent, err := cluster.Build(m.TempDir())
	if err != nil {
		m.Fatalf("%v", err)
	}
	ctl, err := testenv.GoBuild(m.TempDir(), "./cmd/metalvipctl")
	if err != nil {
		m.Fatalf("%v", err)
	}
	harness.Step("starting etcd and kube-apiserver")
	srv := kubeapi.Own(m)
	harness.Step("building the lab: 3 nodes, FRR router, client (30 addresses), remote client; agents and the CCM")
	c := cluster.New(m, srv, cluster.Options{CCMBinary: ccm, AgentBinary: agent, ClientAddrs: 29})
	for _, n := range c.Lab.Nodes {
		n.ServeHTTP(m, 80)
	}

	harness.Step("creating Services in namespace %s", c.NS)
	type row struct {
		name, mode, policy string
		vip                netip.Addr
	}
	var rows []row
	for _, name := range []string{"web-a", "web-b", "web-c"} {
		rows = append(rows, row{name, "L2", "Cluster", c.Service(name)})
	}
	rows = append(rows, row{"bgp-cluster", "BGP", "Cluster", c.Service("bgp-cluster", cluster.InPool("bgp-"+c.NS))})
	rows = append(rows, row{"bgp-local", "BGP", "Local", c.Service("bgp-local", cluster.Local, cluster.InPool("bgp-"+c.NS))})
	c.Endpoints("bgp-local", "node2")
	// Three addresses on three nodes, for DNS round-robin.
	for _, ip := range c.ServiceIPs("web-multi", 3, cluster.Annotate(annotation.VIPCount, "3")) {
		rows = append(rows, row{"web-multi", "L2, 3 VIPs", "Cluster", ip})
	}
	// One address that every node answers, each for its share of the on-link clients.
	pool := c.PerClientPool("per-client")
	rows = append(rows, row{"web-per-client", "L2 per client", "Cluster", c.Service("web-per-client", cluster.InPool(pool))})
	clients := c.NewClients(c.ClientAddrs())

	harness.Step("waiting until every address is announced")
	for _, r := range rows {
		switch {
		case r.mode == "L2 per client":
			harness.Eventually(m, 30*time.Second, r.name+" answered, each client by one node", func() bool {
				_, ok := clients.Owners(r.vip, 300*time.Millisecond)
				return ok
			})
		case strings.HasPrefix(r.mode, "L2"):
			harness.Eventually(m, 30*time.Second, r.name+" answered", func() bool { return c.Owner(r.vip) != "" })
		default:
			want := 3
			if r.policy == "Local" {
				want = 1
			}
			harness.Eventually(m, 60*time.Second, r.name+" advertised", func() bool { return len(c.NextHops(r.vip)) == want })
		}
	}

	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tVIP\tMODE\tTRAFFIC POLICY\tANNOUNCED BY\tANSWERED (HTTP)")
	for _, r := range rows {
		var announced, answered string
		switch {
		case r.mode == "L2 per client":
			owners, _ := clients.Owners(r.vip, 300*time.Millisecond)
			shares := cluster.Shares(owners)
			var parts []string
			for _, n := range c.Lab.Nodes {
				parts = append(parts, fmt.Sprintf("%s %d", n.Name, shares[n.Name]))
			}
			announced = "ARP, clients per node: " + strings.Join(parts, ", ") + " of 30"
			answered = "client on the segment: " + strings.Join(askNodes(c.Lab.Client, r.vip, 3), ", ")
		case strings.HasPrefix(r.mode, "L2"):
			announced = c.Owner(r.vip) + " (ARP)"
			answered = "client on the segment: " + strings.Join(askNodes(c.Lab.Client, r.vip, 3), ", ")
		default:
			announced = "next hops at the router: " + strings.Join(c.NextHops(r.vip), ", ")
			answered = "remote client: " + strings.Join(askNodes(c.Lab.Remote, r.vip, 12), ", ")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", r.name, r.vip, r.mode, r.policy, announced, answered)
	}
	w.Flush()
	fmt.Println()

	vip := rows[0].vip
	victim := c.Owner(vip)
	harness.Step("killing %s, which answers for %s (link down, agent killed), while the client probes every 10 ms", victim, vip)
	c.T = m
	outage := c.Failover(vip, victim)
	now := c.Owner(vip)
	fmt.Printf("\n  %s failed over from %s to %s: the client saw %d ms without answers\n", vip, victim, now, outage.Milliseconds())
	fmt.Printf("  HTTP from the client now: %s\n\n", strings.Join(askNodes(c.Lab.Client, vip, 1), ", "))
	harness.Step("bringing %s back", victim)
	c.Revive(victim)
	harness.Eventually(m, 60*time.Second, victim+" back", func() bool {
		st, err := c.Agents[victim].Client.GetState(context.Background(), &agentv1.GetStateRequest{})
		return err == nil && !st.GetRestored()
	})
	harness.Step("%s is back; %s is answered by %s", victim, vip, c.Owner(vip))

	if os.Getenv("KEEP") == "1" {
		keep(c, srv, m, ctl, rows[0].vip, rows[3].vip)
		return
	}
	harness.Step("tearing down")
}

// askNodes sends n HTTP requests (each on a new connection) to vip from h and returns the
// distinct node names that answered, sorted.
func askNodes(h *lab.Host, vip netip.Addr, n int) []string {
	seen := map[string]bool{}
	for range n {
		body, err := probe.Get(h, netip.AddrPortFrom(vip, 80), 2*time.Second)
		if err != nil {
			body = "(" + err.Error() + ")"
		}
		seen[body] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func keep(c *cluster.Cluster, srv *kubeapi.Server, m *testenv.Main, ctl string, l2VIP, bgpVIP netip.Addr) {
	kc := srv.Kubeconfig(m, nil)
	node1 := c.Lab.Nodes[0]
	fmt.Printf(`
The lab stays up until you press Ctrl-C.

  API server:   KUBECONFIG=%s (client-go tools; Debian's kubectl is too old)
  namespaces:   %s
  HTTP, on-link: ip netns exec %s curl -s http://%s/
  HTTP, routed:  ip netns exec %s curl -s http://%s/
  the router:   vtysh --vty_socket %s -c 'show bgp ipv4 unicast'
  status:       %[8]s status --kubeconfig %[1]s
  an agent:     ip netns exec %[9]s %[8]s agent %[10]s --address %[11]s \
                  --tls-ca %[12]s/ca.crt --tls-cert %[12]s/ccm.crt --tls-key %[12]s/ccm.key
                (its log and state are under the folders printed above)

`, kc, strings.Join(c.Lab.Namespaces(), " "), c.Lab.Client.NS, l2VIP, c.Lab.Remote.NS, bgpVIP, c.Lab.Dir,
		ctl, node1.NS, node1.Name, node1.IPv4, c.PKI)
	select {}
}
