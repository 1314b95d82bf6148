package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// withExternal gives the (LoadBalancer) Service the given externalIPs, asking metalvip to
// announce them.
func withExternal(ips ...string) cluster.SvcOpt {
	return func(s *corev1.Service) {
		s.Spec.ExternalIPs = ips
		cluster.Annotate(annotation.AnnounceExternalIPs, "true")(s)
	}
}

// clusterIPWithExternal is withExternal on a ClusterIP Service, whose externalIPs are refused.
func clusterIPWithExternal(ips ...string) cluster.SvcOpt {
	return func(s *corev1.Service) {
		withExternal(ips...)(s)
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
}

// TestExternalIPsAndClusterIPRange: an externalIP of a LoadBalancer Service in a pool that
// allows it, and the ClusterIP range of a BGPPeer, reach FRR from every node and carry the
// remote client's connections to a node; an externalIP outside every permitting pool, or of a
// ClusterIP Service, is refused with an Event.
func TestExternalIPsAndClusterIPRange(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	ctx := context.Background()
	for _, n := range c.Lab.Nodes {
		n.ServeName(t, 80)
	}
	every := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	c.Object(v1alpha1.IPPoolResource, "ext-"+c.NS, fmt.Sprintf(`{addresses: ["203.0.113.160/28"], autoAssign: false, externalIPs: Allow, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP}}`, c.NS))

	t.Run("an externalIP of a permitting pool is announced by every node and reached", func(t *testing.T) {
		c.T = t
		c.ServiceNoWait("ext", withExternal("203.0.113.161"))
		ip := netip.MustParseAddr("203.0.113.161")
		took := harness.Eventually(t, 60*time.Second, "FRR has the externalIP from every node", func() bool {
			return slices.Equal(c.NextHops(ip), every)
		})
		conn, err := c.Lab.Remote.DialName(netip.AddrPortFrom(ip, 80), 5*time.Second)
		if err != nil {
			t.Fatalf("the remote client cannot reach the externalIP: %v", err)
		}
		t.Logf("externalIP %s at FRR via %v after %s; the remote client's connection is served by %s", ip, every, took.Round(time.Millisecond), conn.Server)
		conn.Close()
	})

	t.Run("the ClusterIP range of the BGPPeer is one aggregate from every node", func(t *testing.T) {
		c.T = t
		patch := []byte(`{"spec":{"serviceCIDRs":["203.0.113.192/27"]}}`)
		if _, err := c.Dyn.Resource(v1alpha1.BGPPeerResource).Patch(ctx, "router-"+c.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var route string
		took := harness.Eventually(t, 60*time.Second, "FRR has 203.0.113.192/27 from every node", func() bool {
			out, _ := c.Lab.Router.Run(ctx, "ip", "route", "show", "203.0.113.192/27")
			route = string(out)
			return strings.Count(route, "via 198.51.100.1") == 3
		})
		addr := netip.MustParseAddrPort("203.0.113.200:80")
		conn, err := c.Lab.Remote.DialName(addr, 5*time.Second)
		if err != nil {
			t.Fatalf("the remote client cannot reach %s through the aggregate: %v", addr, err)
		}
		t.Logf("after %s the router has\n%s\nand %s is served by %s", took.Round(time.Millisecond), strings.TrimSpace(route), addr, conn.Server)
		conn.Close()
	})

	t.Run("externalIPs outside every permitting pool are refused with an Event", func(t *testing.T) {
		c.T = t
		// 203.0.113.5 lies in the L2 pool, which does not allow externalIPs; .240 in no pool.
		c.ServiceNoWait("hijack", withExternal("203.0.113.5", "203.0.113.240"))
		harness.Eventually(t, 30*time.Second, "an ExternalIPRefused Event for each address", func() bool {
			ev := c.Events("hijack", "ExternalIPRefused")
			return strings.Contains(ev, "203.0.113.5") && strings.Contains(ev, "203.0.113.240")
		})
		t.Logf("Events:\n%s", c.Events("hijack", "ExternalIPRefused"))
		var cond string
		harness.Eventually(t, 30*time.Second, "the Service's ExternalIPsAnnounced condition is False", func() bool {
			svc, err := c.Srv.Client.CoreV1().Services(c.NS).Get(ctx, "hijack", metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, cd := range svc.Status.Conditions {
				if cd.Type == "metalvip.io/ExternalIPsAnnounced" && cd.Status == metav1.ConditionFalse {
					cond = cd.Message
					return true
				}
			}
			return false
		})
		t.Logf("condition: %s", cond)
		time.Sleep(2 * time.Second) // what would have been announced by now
		for _, ip := range []string{"203.0.113.5", "203.0.113.240"} {
			if hops := c.NextHops(netip.MustParseAddr(ip)); len(hops) > 0 {
				t.Errorf("%s is routed at FRR via %v", ip, hops)
			}
			if got := c.Answerers(netip.MustParseAddr(ip)); len(got) > 0 {
				t.Errorf("%s is answered by ARP from %v", ip, got)
			}
		}
		// Issue 30, fault 8: a ClusterIP Service, which no services.loadbalancers quota
		// counts, has no externalIP announced, even of a permitting pool.
		c.ServiceNoWait("noquota", clusterIPWithExternal("203.0.113.162"))
		harness.Eventually(t, 30*time.Second, "an ExternalIPRefused Event for the ClusterIP Service", func() bool {
			return strings.Contains(c.Events("noquota", "ExternalIPRefused"), "only a LoadBalancer Service")
		})
		if hops := c.NextHops(netip.MustParseAddr("203.0.113.162")); len(hops) > 0 {
			t.Errorf("a ClusterIP Service's externalIP is routed at FRR via %v", hops)
		}
		// And the permitted externalIP of the other Service is untouched.
		if !slices.Equal(c.NextHops(netip.MustParseAddr("203.0.113.161")), every) {
			t.Errorf("the permitted externalIP lost its routes")
		}
	})
}
