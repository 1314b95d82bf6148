package desired

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// maxRefusedShown is how many refused communities a reason names.
const maxRefusedShown = 5

// ServiceCommunities decides which of the communities a Service asks for with the annotation
// metalvip.io/bgp-communities its BGP routes carry: those its pool lists in
// announce.bgp.serviceCommunities (the annotation is the tenant's request, the pool the
// owner's consent). refused says why the others are left out, "" when none are. A pool that
// is not BGP, or that aggregates, grants none.
func ServiceCommunities(svc *v1.Service, pool *pools.Pool) (granted []string, refused string) {
	asked := annotation.BGPCommunitiesFromService(svc)
	if len(asked) == 0 {
		return nil, ""
	}
	var why []string
	for _, c := range asked {
		switch {
		case pools.ValidCommunity(c) != nil:
			why = append(why, pools.ValidCommunity(c).Error())
		case pool == nil:
			why = append(why, fmt.Sprintf("%s: the address has no pool", c))
		case pool.Announce.Mode != planner.BGP:
			why = append(why, fmt.Sprintf("%s: IPPool %s announces by L2, and communities are BGP's", c, pool.Name))
		case !slices.Contains(pool.Announce.ServiceCommunities, c):
			why = append(why, fmt.Sprintf("%s: IPPool %s does not list it in announce.bgp.serviceCommunities", c, pool.Name))
		default:
			granted = append(granted, c)
		}
	}
	slices.Sort(granted)
	if len(why) > maxRefusedShown {
		// The annotation is the tenant's to write (up to the API server's 256 KiB): the Event
		// and the log line stay short whatever it holds.
		why = append(why[:maxRefusedShown], fmt.Sprintf("and %d more", len(why)-maxRefusedShown))
	}
	if len(why) > 0 {
		refused = fmt.Sprintf("annotation %s: %s", annotation.BGPCommunities, strings.Join(why, "; "))
	}
	return slices.Compact(granted), refused
}
