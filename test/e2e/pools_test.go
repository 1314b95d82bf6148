package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestAnAddressKeepsItsOwnPoolsRules checks on the wire that the pool whose rules announce an
// address is the allocator's record, never a field a tenant can write, and that an address
// whose pool is gone fails closed.
func TestAnAddressKeepsItsOwnPoolsRules(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	bgpPool := "bgp-" + c.NS

	// l2Only checks, for a while, that vip is answered by ARP from one node and has no route
	// on the router: the rules of its own (L2) pool, not the BGP pool's.
	l2Only := func(t *testing.T, name string, vip netip.Addr) {
		t.Helper()
		harness.Eventually(t, 30*time.Second, vip.String()+" answered by one node in L2", func() bool { return len(c.Answerers(vip)) == 1 })
		deadline := time.Now().Add(3 * time.Second)
		for i := 0; i < 30 && time.Now().Before(deadline); i++ {
			if hops := c.NextHops(vip); len(hops) > 0 {
				t.Fatalf("%s is routed by BGP to %v: the tenant's annotation chose the pool; Announced: %s", vip, hops, c.Announced(name))
			}
			if who := c.Answerers(vip); len(who) != 1 {
				t.Fatalf("%s answered by %v in L2, want one node; Announced: %s", vip, who, c.Announced(name))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if a := c.Announced(name); !strings.Contains(a, vip.String()+" (L2)") {
			t.Errorf("Announced condition %q; want %s announced in L2", a, vip)
		}
	}
	address := func(name string) netip.Addr {
		s, err := c.Srv.Client.CoreV1().Services(c.NS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return netip.Addr{}
		}
		a, _ := netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return a
	}

	t.Run("a Service created with allocated-pool naming the BGP pool is announced in L2", func(t *testing.T) {
		c.T = t
		vip := c.Service("born-tampered", cluster.Annotate(annotation.AllocatedPool, bgpPool))
		l2Only(t, "born-tampered", vip)
	})

	// tamperThenRestart: a tenant writes pool as its Service's allocated-pool, then the CCM
	// restarts; the address must keep its L2 pool's rules and not change.
	tamperThenRestart := func(t *testing.T, name, pool string) {
		c.T = t
		vip := c.Service(name)
		l2Only(t, name, vip)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotation.AllocatedPool, pool)
		if _, err := c.Srv.Client.CoreV1().Services(c.NS).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		c.CCM.Stop(10 * time.Second)
		c.StartCCM()
		harness.Eventually(t, 30*time.Second, "the new CCM learnt what the agents hold", func() bool {
			return strings.Contains(c.CCM.Output(), "Learnt what the agents announce")
		})
		time.Sleep(2 * time.Second) // its first plan and push
		l2Only(t, name, vip)
		if got := address(name); got != vip {
			t.Errorf("the address changed from %s to %s", vip, got)
		}
	}
	t.Run("a tenant overwriting allocated-pool, then a CCM restart: same address, same L2", func(t *testing.T) {
		tamperThenRestart(t, "tampered", bgpPool)
	})
	// The soak's seed 8: the record a tenant wrote names a pool that does not exist (deleted
	// while the CCM restarted); the rebuild kept the name, and the address was dark.
	t.Run("a tenant naming a pool that does not exist, then a CCM restart: still announced in L2", func(t *testing.T) {
		tamperThenRestart(t, "forged-gone", "gone-"+c.NS)
	})

	t.Run("a BGP pool deleted under its Service: its address is answered by no node", func(t *testing.T) {
		c.T = t
		pool := "doomed-" + c.NS
		c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.128/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP}}`, c.NS))
		vip := c.Service("orphan", cluster.InPool(pool))
		harness.Eventually(t, 30*time.Second, vip.String()+" routed by BGP", func() bool { return len(c.NextHops(vip)) > 0 })
		if err := c.Dyn.Resource(v1alpha1.IPPoolResource).Delete(t.Context(), pool, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 30*time.Second, vip.String()+" withdrawn from the router", func() bool { return len(c.NextHops(vip)) == 0 })
		for i := range 6 {
			if who := c.Answerers(vip); len(who) > 0 {
				t.Fatalf("ARP request %d for %s (of a deleted BGP pool) answered by %v; Announced: %s", i, vip, who, c.Announced("orphan"))
			}
		}
		if got := address("orphan"); got != vip {
			t.Errorf("the Service's address changed from %s to %s; it keeps it", vip, got)
		}
		if ev := c.Events("orphan", "PoolDeleted"); ev == "" {
			t.Errorf("no PoolDeleted Event on the Service")
		}
	})
}
