// Command democluster is `make demo-cluster`: metalvip on real kubelets in the lab
// (test/kubecluster), installed as a user installs it: the images imported into each node's
// containerd, the certificates as Secrets, manifests/install.yaml applied. It shows the nodes
// the CCM pod initialised, the agents, an HTTP workload behind L2 and BGP Services and who
// answers for each, kills the node answering for an L2 address and shows the outage a client
// saw, then tears it all down. KEEP=1 leaves it up until Ctrl-C, with the kubectl command to
// use. Run as root.
package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/probe"
	"github.com/metalvip/metalvip/test/kubecluster"
	"github.com/metalvip/metalvip/test/testenv"
)

func main() {
	m := harness.Program("metalvip-democluster", "make demo-cluster builds network namespaces and runs kubelets: run it as root")
	defer m.Close()
	ctx := context.Background()

	images, err := kubecluster.Images()
	if err != nil {
		m.Fatalf("%v", err)
	}
	harness.Step("bringing up the cluster: control plane, 3 nodes (containerd, kubelet --cloud-provider=external, kube-proxy), FRR router, clients")
	c := kubecluster.New(m, kubecluster.Options{Images: images})
	harness.Step("cluster up: control plane ready after %s, nodes Ready after %s", c.ControlPlaneReady.Round(time.Millisecond), c.NodesReady.Round(time.Millisecond))
	empty := ""
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		m.Fatalf("%v", err)
	}
	harness.Step("installing metalvip: metalvipctl certs | kubectl apply; kubectl apply --server-side -f manifests/install.yaml")
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		m.Fatalf("%v", err)
	}
	if d, err := c.WaitInitialised(ctx, 2*time.Minute); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	} else {
		harness.Step("the CCM pod initialised every node in %s", d.Round(time.Millisecond))
	}
	if d, err := c.WaitAgents(ctx, 2*time.Minute); err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	} else {
		harness.Step("agents Ready on every node %s later", d.Round(time.Millisecond))
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		m.Fatalf("%v", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tPROVIDER ID\tTAINTS")
	for _, n := range nodes.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", n.Name, n.Status.Addresses[0].Address, n.Spec.ProviderID, len(n.Spec.Taints))
	}
	tw.Flush()

	harness.Step("the workload: an HTTP server on node2 and node3; Services in an L2 and a BGP pool, externalTrafficPolicy Cluster and Local")
	w, err := c.DeployWorkload(ctx, "node2", "node3")
	if err != nil {
		m.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	time.Sleep(2 * time.Second) // BGP routes reach the router
	show(m, c, w)

	vip := w.VIPs[kubecluster.ServiceL2Local]
	harness.Step("killing the node that answers for %s (link down, kubelet, containerd and its pods gone) while the client asks it over HTTP every 20 ms", vip)
	f, err := c.KillOwner(ctx, vip)
	if err != nil {
		m.Fatalf("%v", err)
	}
	harness.Step("%s", f)
	show(m, c, w)

	if os.Getenv("KEEP") != "" {
		fmt.Printf("\nThe cluster stays up until Ctrl-C. kubectl on the cluster's network:\n  ip netns exec %s %s --kubeconfig %s get pods -A -o wide\n",
			c.Lab.Control.NS, toolPath("kubectl"), c.Kubeconfig)
		fmt.Printf("the client: ip netns exec %s curl http://%s/\n", c.Lab.Client.NS, vip)
		select {}
	}
	harness.Step("tearing down")
}

// show prints each Service's address, who answers it and what a client gets.
func show(m *testenv.Main, c *kubecluster.Cluster, w *kubecluster.Workload) {
	names := make([]string, 0, len(w.VIPs))
	for n := range w.VIPs {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tVIP\tANSWERED BY\tCLIENT GETS")
	for _, n := range names {
		vip := w.VIPs[n]
		var who string
		client := c.Lab.Client
		if strings.Contains(n, "bgp") {
			hops, err := c.NextHops(vip)
			if err != nil {
				m.Fatalf("%v", err)
			}
			who = "BGP next hops " + strings.Join(hops, ",")
			client = c.Lab.Remote
		} else {
			owner, _ := c.Owner(vip)
			who = "ARP " + owner
		}
		body, err := probe.Get(client, netip.AddrPortFrom(vip, 80), 2*time.Second)
		if err != nil {
			body = err.Error()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (from %s)\n", n, vip, who, body, client.Name)
	}
	tw.Flush()
}

func toolPath(name string) string {
	root, _ := testenv.RepoRoot()
	return root + "/.cache/bin/" + name
}
