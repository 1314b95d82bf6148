package announcer

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/metalvip/metalvip/loadbalancer/report"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// dataPlanes owns what the agents say of their nodes' kube-proxy (metalvip-agent
// --kube-proxy-healthz), and which health check node ports each node is asked to watch: those
// of the Services with externalTrafficPolicy Local that have a ready endpoint on it. Only the
// loop calls it.
//
// A node whose kube-proxy is not healthy takes no VIP (plannerNode). kube-proxy drops a Local
// Service's traffic on a node it believes has no endpoint, for up to its sync period after
// the pod became ready; so a node joins a Local Service's BGP announcers only once its
// kube-proxy says on the Service's health check node port that it sends the traffic to the
// node's endpoints (serving), and stands by for its L2 address after the candidates that
// serve (rank): it takes over only when none of those lives. A node that announces the
// Service already stays (its port failing for a moment moves nothing; its endpoints leaving
// do, through the EndpointSlices), and when no node serves yet every node with an endpoint
// announces, as without the check.
type dataPlanes struct {
	said  map[string]*agentv1.DataPlane // node -> its agent's word; nil: it does not check
	ports map[string]map[string]uint32  // node -> Service -> its health check node port
	nodes map[string][]string           // Service -> the nodes in ports
	vips  map[netip.Addr][]uint32       // address -> the ports of its Local Services
}

func newDataPlanes() dataPlanes {
	return dataPlanes{said: map[string]*agentv1.DataPlane{}, ports: map[string]map[string]uint32{}, nodes: map[string][]string{},
		vips: map[netip.Addr][]uint32{}}
}

// setVIP records the health check node ports of the Local Services behind an address (none:
// forgets it).
func (d *dataPlanes) setVIP(ip netip.Addr, ports []uint32) {
	if len(ports) == 0 {
		delete(d.vips, ip)
		return
	}
	d.vips[ip] = ports
}

// rank orders an L2 address's standbys (every candidate but the first, which answers and
// stays) so that those whose kube-proxy serves every Local Service behind it come first, each
// group in the plan's order: a standby whose kube-proxy has not written its pod's rules yet
// takes over only when no serving one lives. It returns nodes itself when nothing changes.
func (d *dataPlanes) rank(nodes []string, ip netip.Addr) []string {
	ports := d.vips[ip]
	if len(ports) == 0 || len(nodes) < 3 {
		return nodes
	}
	serves := func(n string) bool {
		for _, p := range ports {
			if !d.serves(n, p) {
				return false
			}
		}
		return true
	}
	out := make([]string, 0, len(nodes))
	out = append(out, nodes[0])
	var later []string
	for _, n := range nodes[1:] {
		if serves(n) {
			out = append(out, n)
		} else {
			later = append(later, n)
		}
	}
	if len(later) == 0 {
		return nodes
	}
	return append(out, later...)
}

// down reports whether the node's agent says its kube-proxy is not healthy.
func (d *dataPlanes) down(node string) bool {
	dp := d.said[node]
	return dp != nil && !dp.GetReady()
}

// serves reports whether the node's kube-proxy says it sends the traffic of the Service
// whose health check node port is port to the node's endpoints; true when its agent does not
// check (or has said nothing yet), or for no port.
func (d *dataPlanes) serves(node string, port uint32) bool {
	dp := d.said[node]
	if dp == nil || port == 0 {
		return true
	}
	return slices.Contains(dp.GetServingPorts(), port)
}

// take records what a node's agent said; it returns whether its kube-proxy's health changed
// and the ports whose serving changed.
func (d *dataPlanes) take(node string, dp *agentv1.DataPlane) (health bool, ports []uint32) {
	old, had := d.said[node]
	d.said[node] = dp
	if had && old.GetReady() != dp.GetReady() || !had && d.down(node) || (old == nil) != (dp == nil) {
		health = true
	}
	before, after := old.GetServingPorts(), dp.GetServingPorts()
	if (old == nil) != (dp == nil) {
		// Checked or no longer: every port's answer changed.
		before, after = nil, slices.Concat(d.portsOf(node), after)
	}
	for _, p := range before {
		if !slices.Contains(after, p) {
			ports = append(ports, p)
		}
	}
	for _, p := range after {
		if !slices.Contains(before, p) {
			ports = append(ports, p)
		}
	}
	return health, ports
}

// forget drops what a node's agent said (the node is gone).
func (d *dataPlanes) forget(node string) { delete(d.said, node) }

// setPorts records that the Service key (port 0: none, or not Local) has a ready endpoint on
// nodes; it returns the nodes whose ports changed (their states carry them).
func (d *dataPlanes) setPorts(key string, port uint32, nodes []string) (changed []string) {
	if port == 0 {
		nodes = nil
	}
	for _, n := range d.nodes[key] {
		if !slices.Contains(nodes, n) {
			delete(d.ports[n], key)
			if len(d.ports[n]) == 0 {
				delete(d.ports, n)
			}
			changed = append(changed, n)
		}
	}
	for _, n := range nodes {
		if d.ports[n][key] == port {
			continue
		}
		if d.ports[n] == nil {
			d.ports[n] = map[string]uint32{}
		}
		d.ports[n][key] = port
		changed = append(changed, n)
	}
	if len(nodes) == 0 {
		delete(d.nodes, key)
	} else {
		d.nodes[key] = slices.Clone(nodes)
	}
	return changed
}

// portsOf returns the health check node ports the node is asked to watch, sorted.
func (d *dataPlanes) portsOf(node string) []uint32 {
	var out []uint32
	for _, p := range d.ports[node] {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// servicesOn returns the Services whose port, watched on node, is one of ports.
func (d *dataPlanes) servicesOn(node string, ports []uint32) []string {
	var out []string
	for _, key := range slices.Sorted(maps.Keys(d.ports[node])) {
		if slices.Contains(ports, d.ports[node][key]) {
			out = append(out, key)
		}
	}
	return out
}

// serving narrows a Local Service's endpoint nodes (and their counts) to those whose
// kube-proxy serves it (port) and those that announce it already (now); to all of them when
// none would be left.
func (d *dataPlanes) serving(nodes []string, counts map[string]int, port uint32, now []string) ([]string, map[string]int) {
	keep := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if d.serves(n, port) || slices.Contains(now, n) {
			keep = append(keep, n)
		}
	}
	if len(keep) == len(nodes) || len(keep) == 0 {
		return nodes, counts
	}
	kept := make(map[string]int, len(keep))
	for _, n := range keep {
		if c, ok := counts[n]; ok {
			kept[n] = c
		}
	}
	return keep, kept
}

// dataPlaneRound takes what the agents said of their kube-proxy: a node whose health changed
// is planned again (its Event and the pools' conditions tell it), and the addresses of the
// Local Services whose port began or stopped serving on a node are derived again. It reports
// whether a node's health changed.
func (a *Announcer) dataPlaneRound(ch changes, r *round) (changed bool) {
	s := &a.loop
	for _, node := range slices.Sorted(maps.Keys(ch.dataPlane)) {
		dp := ch.dataPlane[node]
		health, ports := s.dataPlane.take(node, dp)
		if health {
			changed = true
			a.writeDataPlane(node, dp)
		}
		for _, key := range s.dataPlane.servicesOn(node, ports) {
			for _, ip := range s.shown.addrs[key] {
				r.spec[ip] = true
			}
		}
	}
	return changed
}

// writeDataPlane tells with an Event on the Node that its kube-proxy became healthy or not.
func (a *Announcer) writeDataPlane(node string, dp *agentv1.DataPlane) {
	s := &a.loop
	n := s.byName[node]
	if n == nil {
		return
	}
	key := "dataplane/" + node
	down := dp != nil && !dp.GetReady()
	was, said := s.statusSet[key]
	if !said && !down || was == fmt.Sprint(down) {
		s.statusSet[key] = fmt.Sprint(down)
		return
	}
	s.statusSet[key] = fmt.Sprint(down)
	if down {
		a.cfg.Recorder.Eventf(n, v1.EventTypeWarning, report.ReasonDataPlaneNotReady,
			"kube-proxy on %s is not healthy (%s): the node takes no VIP until it is; its VIPs move to other nodes. Check the kube-proxy pod on the node", node, dp.GetDetail())
		return
	}
	a.cfg.Recorder.Eventf(n, v1.EventTypeNormal, report.ReasonDataPlaneReady, "kube-proxy on %s is healthy again: the node may take VIPs", node)
}
