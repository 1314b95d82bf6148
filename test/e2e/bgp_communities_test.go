package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestServiceCommunities (issue 31, metallb#934): a Service adds BGP communities to its own
// routes with metalvip.io/bgp-communities, only those its pool lists in
// announce.bgp.serviceCommunities: the router sees the pool's community and the allowed one on
// every node's path (with the pool's large community), a community the pool does not list is left out with a Warning Event, and
// another Service of the pool carries only the pool's.
func TestServiceCommunities(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary})
	pool := "comm-" + c.NS
	c.Object(v1alpha1.IPPoolResource, pool, fmt.Sprintf(`{addresses: ["203.0.113.96/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]},
		announce: {mode: BGP, bgp: {communities: ["64496:1"], largeCommunities: ["4200000000:1:2"], serviceCommunities: ["64496:200", "64496:300"]}}}`, c.NS))
	tagged := c.Service("tagged", cluster.InPool(pool), cluster.Annotate(annotation.BGPCommunities, "64496:200, 64496:999"))
	plain := c.Service("plain", cluster.InPool(pool))

	// communities returns the communities of each of the router's paths to vip, one string
	// per path, standard then large ("64496:1 64496:200 4200000000:1:2"), sorted.
	communities := func(vip string) []string {
		out, err := c.Lab.Vtysh("show bgp ipv4 unicast " + vip + "/32 json")
		if err != nil {
			return nil
		}
		var got struct {
			Paths []struct {
				Community struct {
					String string `json:"string"`
				} `json:"community"`
				Large struct {
					String string `json:"string"`
				} `json:"largeCommunity"`
			} `json:"paths"`
		}
		if json.Unmarshal([]byte(out), &got) != nil {
			return nil
		}
		var cs []string
		for _, p := range got.Paths {
			cs = append(cs, strings.TrimSpace(p.Community.String+" "+p.Large.String))
		}
		slices.Sort(cs)
		return cs
	}
	harness.Eventually(t, 60*time.Second, "every node's path to the tagged VIP carries the pool's community and the allowed one", func() bool {
		return slices.Equal(communities(tagged.String()), []string{"64496:1 64496:200 4200000000:1:2", "64496:1 64496:200 4200000000:1:2", "64496:1 64496:200 4200000000:1:2"})
	})
	harness.Eventually(t, 30*time.Second, "the other Service's paths carry the pool's community alone", func() bool {
		return slices.Equal(communities(plain.String()), []string{"64496:1 4200000000:1:2", "64496:1 4200000000:1:2", "64496:1 4200000000:1:2"})
	})
	harness.Eventually(t, 30*time.Second, "a Warning Event names the community the pool does not list", func() bool {
		ev := c.Events("tagged", "BGPCommunityRefused")
		return strings.Contains(ev, "64496:999: IPPool "+pool+" does not list it in announce.bgp.serviceCommunities")
	})
	if ev := c.Events("plain", "BGPCommunityRefused"); ev != "" {
		t.Errorf("a Service that asks for no community was warned: %s", ev)
	}
}
