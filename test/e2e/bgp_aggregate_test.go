package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestAggregates (issue 31, MetalLB's aggregationLength): a BGP pool with aggregationLength 28
// is routed as one /28 over every node, and no /32 of its addresses; the aggregate stays while
// any of its addresses is held and goes with the last.
func TestAggregates(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	pool := "agg-" + c.NS
	c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.96/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {aggregationLength: 28}}}`, c.NS))
	a := c.Service("agg-a", cluster.InPool(pool))
	b := c.Service("agg-b", cluster.InPool(pool))
	every := []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"}
	hops := func(dst string) []string {
		h, err := c.Lab.RouteNextHops(dst)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	harness.Eventually(t, 60*time.Second, "the router routes the /28 over every node", func() bool {
		return slices.Equal(hops("203.0.113.96/28"), every)
	})
	for _, vip := range []string{a.String(), b.String()} {
		if h := hops(vip + "/32"); len(h) != 0 {
			t.Errorf("the router has a host route for %s via %v besides the aggregate", vip, h)
		}
	}
	del := func(name string) {
		t.Helper()
		if err := c.Srv.Client.CoreV1().Services(c.NS).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	del("agg-a")
	time.Sleep(2 * time.Second) // a withdrawal would be at the router by now
	if got := hops("203.0.113.96/28"); !slices.Equal(got, every) {
		t.Errorf("with agg-b still holding %s the aggregate goes via %v; want %v", b, got, every)
	}
	del("agg-b")
	harness.Eventually(t, 30*time.Second, "the aggregate is withdrawn with its last address", func() bool {
		return len(hops("203.0.113.96/28")) == 0
	})
}
