package announcer

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// LabelControlPlane marks control-plane nodes; the NodeRestriction admission plugin keeps a
// kubelet from setting node-role labels on its own Node.
const LabelControlPlane = "node-role.kubernetes.io/control-plane"

// reserveRound answers one fact: which addresses no pool may give out or announce. Today that
// is the control-plane VIP (kubeadm's --control-plane-endpoint), which the agents of the
// control-plane nodes serve from their local files and report in GetState: a pool covering
// it would let a tenant ask for the API endpoint's address and workers answer for it (issue
// 30, fault 7). Only reports of nodes labelled control-plane count, so a worker's agent
// cannot take an address away from a Service. The reserved addresses are cut out of every
// pool (objects.Objects.Reserve, pools.WithReserved), whose condition then says so.
func (a *Announcer) reserveRound(ch changes) {
	s := &a.loop
	for node, vip := range ch.controlPlane {
		if vip.IsValid() {
			s.cpVIPs[node] = vip
		} else {
			delete(s.cpVIPs, node)
		}
	}
	if len(ch.controlPlane) == 0 && !ch.nodes || a.cfg.Objects == nil {
		return
	}
	a.cfg.Objects.Reserve(reservedAddrs(s.cpVIPs, s.byName))
}

// reservedAddrs returns the control-plane VIPs that control-plane nodes report serving, each
// with what uses it.
func reservedAddrs(reported map[string]netip.Addr, nodes map[string]*v1.Node) map[netip.Addr]string {
	by := map[netip.Addr][]string{}
	for node, vip := range reported {
		n := nodes[node]
		if n == nil {
			continue
		}
		if _, cp := n.Labels[LabelControlPlane]; !cp {
			klog.V(2).InfoS("A node that is not labelled control-plane reports serving a control-plane VIP: not reserved", "node", node, "vip", vip, "label", LabelControlPlane)
			continue
		}
		by[vip] = append(by[vip], node)
	}
	out := make(map[netip.Addr]string, len(by))
	for _, vip := range slices.SortedFunc(maps.Keys(by), netip.Addr.Compare) {
		names := by[vip]
		slices.Sort(names)
		out[vip] = "the control-plane VIP (the kube-apiserver endpoint) that " + strings.Join(names, ", ") + " serve"
	}
	return out
}
