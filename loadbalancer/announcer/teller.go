package announcer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// teller tells people what the plan changed, by Events on the Services, once per change: a
// primary that moved, an address no node may announce, addresses that share a node. It owns
// what it last said and nothing else; the loop gives it the facts. Only the loop calls it.
type teller struct {
	rec       record.EventRecorder
	primaries map[netip.Addr]string // last primary per L2 VIP, for Moved Events
	noNode    map[netip.Addr]bool   // VIPs told to have no eligible node
	groupMsg  map[string]string     // last VIPsShareNodes message per group
	warned    map[string]string     // "kind/key" -> last warning given
}

func newTeller(rec record.EventRecorder) *teller {
	return &teller{rec: rec, primaries: map[netip.Addr]string{}, noNode: map[netip.Addr]bool{}, groupMsg: map[string]string{}, warned: map[string]string{}}
}

// once runs emit unless the same warning (key, what) was the last given.
func (t *teller) once(key, what string, emit func()) {
	if t.warned[key] == what {
		return
	}
	t.warned[key] = what
	emit()
}

// forget makes the next warning of key be given, whatever it says.
func (t *teller) forget(key string) { delete(t.warned, key) }

// placed tells ip's Services (looked up only to tell them) where the plan put it: e, or
// nowhere when ok is false (ip is no longer planned).
func (t *teller) placed(ip netip.Addr, e planner.Entry, ok bool, services func() []*v1.Service) {
	if !ok {
		delete(t.primaries, ip)
		delete(t.noNode, ip)
		return
	}
	if len(e.Nodes) == 0 {
		if !t.noNode[ip] {
			t.noNode[ip] = true
			for _, svc := range services() {
				t.rec.Eventf(svc, v1.EventTypeWarning, report.ReasonNoEligibleNode,
					"No node may announce %s: none is eligible (the pool's node selector, nodes labelled %s, unreachable agents, or no ready local endpoint); see the pool's NodesEligible condition", ip, desired.LabelExcludeLB)
			}
		}
		return
	}
	delete(t.noNode, ip)
	if e.Mode != planner.L2 {
		return
	}
	prev, next := t.primaries[ip], e.Primary()
	t.primaries[ip] = next
	if prev == "" || prev == next {
		return
	}
	why := "to keep the nodes balanced"
	if !slices.Contains(e.Nodes, prev) {
		why = prev + " may no longer announce it: excluded, its agent unreachable, or no local endpoint"
	}
	for _, svc := range services() {
		t.rec.Eventf(svc, v1.EventTypeNormal, report.ReasonMoved, "%s moved from %s to %s: %s", ip, prev, next, why)
	}
}

// spread tells the first Service of group g (services, nil when g has no address left) when
// its addresses ips, sorted, with their primaries ("" for none), come to share a node, and
// when they no longer do.
func (t *teller) spread(g string, ips []netip.Addr, primaries []string, services func() []*v1.Service) {
	if len(ips) == 0 {
		delete(t.groupMsg, g)
		return
	}
	byNode := map[string][]string{}
	var nodes []string
	for i, ip := range ips {
		pr := primaries[i]
		if pr == "" {
			continue
		}
		if byNode[pr] == nil {
			nodes = append(nodes, pr)
		}
		byNode[pr] = append(byNode[pr], ip.String())
	}
	slices.Sort(nodes)
	var shared []string
	for _, n := range nodes {
		if len(byNode[n]) > 1 {
			shared = append(shared, strings.Join(byNode[n], " and ")+" on "+n)
		}
	}
	msg, reason, kind := "", "", v1.EventTypeNormal
	switch {
	case len(shared) > 0:
		reason, kind = report.ReasonVIPsShareNodes, v1.EventTypeWarning
		msg = fmt.Sprintf("%d addresses on %d nodes: fewer nodes are eligible than addresses, so some share a node (%s); they spread when more nodes become eligible", len(ips), len(nodes), strings.Join(shared, "; "))
	case t.groupMsg[g] != "":
		reason = report.ReasonVIPsSpread
		msg = fmt.Sprintf("%d addresses on %d distinct nodes", len(ips), len(nodes))
	}
	if msg == "" || t.groupMsg[g] == msg {
		return
	}
	if reason == report.ReasonVIPsSpread {
		delete(t.groupMsg, g)
	} else {
		t.groupMsg[g] = msg
	}
	if svcs := services(); len(svcs) > 0 {
		t.rec.Eventf(svcs[0], kind, reason, "%s", msg)
	}
}
