package announcer

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// Condition types the announcer sets on IPPools and BGPPeers.
const (
	PoolNodesEligible = v1alpha1.PoolNodesEligible
	PoolAgentsAccept  = v1alpha1.PoolAgentsAccept
	PeerAccepted      = v1alpha1.PeerAccepted
)

// addresses describes who announces each of a Service's addresses now.
func (a *Announcer) addresses(key string) []desired.Address {
	s := &a.loop
	var out []desired.Address
	for _, ip := range s.shown.addrs[key] {
		e, _ := s.planner.Entry(ip)
		pool := s.pools.of(ip)
		out = append(out, desired.AddressOf(ip, e, pool != nil && pool.Announce.PerClient, a.refusals.refusedBy(ip)))
	}
	return out
}

// writeCondition sets a Service's Announced condition and its ServiceAnnouncement when they
// changed; the writer applies them.
func (a *Announcer) writeCondition(key string) {
	s := &a.loop
	svc := a.service(key)
	addrs := a.addresses(key)
	if svc == nil {
		addrs = nil
	}
	a.writeRecord(key, svc, addrs)
	if svc == nil || !a.cfg.Serves.Ours(svc) {
		delete(s.conds, key)
		if svc == nil {
			return
		}
	}
	cur := meta.FindStatusCondition(svc.Status.Conditions, desired.ConditionAnnounced)
	if len(addrs) == 0 {
		if cur != nil && s.conds[key] != noCondition {
			s.conds[key] = noCondition
			ns, name := svc.Namespace, svc.Name
			a.writer.SetPaced("svc/"+key, func(ctx context.Context) error {
				return report.Apply(ctx, a.cfg.Client.CoreV1().RESTClient(), corev1ac.Service(name, ns).WithStatus(corev1ac.ServiceStatus()),
					report.ManagerAnnouncer, report.ServiceStatusPath(ns, name)...)
			})
		}
		return
	}
	c := desired.Condition(addrs, svc.Generation)
	sum := conditionSum(c)
	if s.conds[key] == sum {
		return
	}
	s.conds[key] = sum
	st, shown := report.ServiceCondition(cur, c)
	if shown {
		return // written before (by this or an earlier leader)
	}
	ns, name := svc.Namespace, svc.Name
	ac := corev1ac.Service(name, ns).WithStatus(st)
	a.writer.SetPaced("svc/"+key, func(ctx context.Context) error {
		return report.Apply(ctx, a.cfg.Client.CoreV1().RESTClient(), ac, report.ManagerAnnouncer, report.ServiceStatusPath(ns, name)...)
	})
}

// conditionSum stands for an Announced condition in what the announcer remembers of each
// Service's (a sum, not the text: 10,000 messages took about 2.5 MB).
func conditionSum(c metav1.Condition) uint64 {
	return maphash.String(conditionSeed, string(c.Status)+"|"+c.Reason+"|"+c.Message+"|"+strconv.FormatInt(c.ObservedGeneration, 10)) | 1
}

// noCondition is remembered for a Service whose condition was removed: even, so no sum; not
// 0, which a Service not remembered reads as.
const noCondition uint64 = 2

var conditionSeed = maphash.MakeSeed()

// reachability is a node's AgentReachable condition: status, reason and message.
func reachability(node string, ok bool, port int) (v1.ConditionStatus, string, string) {
	if ok {
		return v1.ConditionTrue, report.ReasonAgentReachable, "The CCM reaches metalvip-agent on " + node
	}
	return v1.ConditionFalse, report.ReasonAgentUnreachable,
		fmt.Sprintf("The CCM cannot reach metalvip-agent on %s; the node takes no new VIPs until it can (check the agent pod, its TLS certificate and port %d)", node, port)
}

// writeReachability tells a node's reachability with an Event and its AgentReachable
// condition.
func (a *Announcer) writeReachability(node string, ok bool) {
	s := &a.loop
	n := s.byName[node]
	if n == nil {
		if got, err := a.nodes.Get(node); err == nil {
			n = got
		}
	}
	if n == nil {
		return
	}
	status, reason, msg := reachability(node, ok, a.cfg.Agents.Port)
	key := "node/" + node
	if s.statusSet[key] == string(status) {
		return
	}
	s.statusSet[key] = string(status)
	kind := v1.EventTypeNormal
	if !ok {
		kind = v1.EventTypeWarning
	}
	a.cfg.Recorder.Eventf(n, kind, reason, "%s", msg)
	for _, c := range n.Status.Conditions {
		if string(c.Type) == report.ConditionAgentReachable && c.Status == status && c.Reason == reason {
			return
		}
	}
	ac := corev1ac.Node(node).WithStatus(corev1ac.NodeStatus().WithConditions(corev1ac.NodeCondition().
		WithType(report.ConditionAgentReachable).WithStatus(status).WithReason(reason).WithMessage(msg).
		WithLastTransitionTime(metav1.NewTime(time.Now()))))
	a.writer.Set(key, func(ctx context.Context) error {
		_, err := a.cfg.Client.CoreV1().Nodes().ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: report.ManagerAnnouncer, Force: true})
		return err
	})
}

// conditionsStatus is the part of an IPPool's or BGPPeer's status the announcer owns.
type conditionsStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions"`
}

// setStatus applies an object's announcer-report.Owned conditions when they changed.
func (a *Announcer) setStatus(kind, name string, gen int64, conds []metav1.Condition) {
	s := &a.loop
	var b strings.Builder
	for _, c := range conds {
		fmt.Fprintf(&b, "%s|%s|%s|%s|%d;", c.Type, c.Status, c.Reason, c.Message, c.ObservedGeneration)
	}
	key := kind + "/" + name
	if s.statusSet[key] == b.String() {
		return
	}
	s.statusSet[key] = b.String()
	cur := a.cfg.Objects.Conditions(kind, name)
	out := make([]metav1.Condition, 0, len(conds))
	same := true
	for _, c := range conds {
		old := meta.FindStatusCondition(cur, c.Type)
		switch {
		case old != nil && old.Status == c.Status:
			c.LastTransitionTime = old.LastTransitionTime
			same = same && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration
		default:
			c.LastTransitionTime = metav1.NewTime(time.Now())
			same = false
		}
		out = append(out, c)
	}
	if same {
		return
	}
	res := v1alpha1.IPPoolResource
	if kind == objects.KindPeer {
		res = v1alpha1.BGPPeerResource
	}
	st := conditionsStatus{Conditions: out}
	if kind == objects.KindPeer {
		st.ObservedGeneration = gen
	}
	a.writer.Set(key, func(ctx context.Context) error {
		return report.ApplyStatus(ctx, a.cfg.Dynamic, res, kind, name, &st, report.ManagerAnnouncer)
	})
}

// writePoolConditions sets each pool's NodesEligible and AgentsAccept conditions, and warns
// once on a pool when no node may announce its addresses.
func (a *Announcer) writePoolConditions() {
	s := &a.loop
	for _, p := range s.set.Pools() {
		elig := a.eligibility(p)
		accept := metav1.Condition{Type: PoolAgentsAccept, Status: metav1.ConditionTrue, Reason: "Accepted", Message: "No agent refused an announcement of this pool", ObservedGeneration: p.Generation}
		var refusals []string
		for _, node := range slices.Sorted(maps.Keys(a.refusals.vips)) {
			for ip, it := range a.refusals.vips[node] {
				if s.pools.of(ip) == p {
					refusals = append(refusals, fmt.Sprintf("%s refused %s: %s: %s", node, ip, it.GetField(), it.GetReason()))
				}
			}
		}
		if len(refusals) > 0 {
			slices.Sort(refusals)
			if len(refusals) > 3 {
				refusals = append(refusals[:3], fmt.Sprintf("and %d more", len(refusals)-3))
			}
			accept.Status, accept.Reason, accept.Message = metav1.ConditionFalse, "Refused", strings.Join(refusals, "; ")
		}
		a.setStatus(objects.KindPool, p.Name, p.Generation, []metav1.Condition{elig, accept})
		if elig.Status == metav1.ConditionFalse && p.Valid() {
			a.warnOnce("pool-eligible/"+p.Name, elig.Message, func() {
				obj := &v1alpha1.IPPool{TypeMeta: metav1.TypeMeta{Kind: objects.KindPool, APIVersion: v1alpha1.GroupVersion.String()}, ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID}}
				a.cfg.Recorder.Eventf(obj, v1.EventTypeWarning, report.ReasonNoEligibleNode, "%s", elig.Message)
			})
		} else {
			a.tell.forget("pool-eligible/" + p.Name)
		}
	}
	s.forgetStatus(objects.KindPool+"/", func(name string) bool {
		return slices.ContainsFunc(s.set.Pools(), func(p *pools.Pool) bool { return p.Name == name })
	})
}

// eligibility says which nodes may announce a pool's addresses, and if none why.
func (a *Announcer) eligibility(p *pools.Pool) metav1.Condition {
	s := &a.loop
	return eligibilityOf(p, s.nodeList, func(n *v1.Node) planner.Node { return s.plannerNode(n, a.cfg.Drain) }, s.dataPlane.down)
}

// eligibilityOf is a pool's NodesEligible condition among nodes, each as the planner knows it.
func eligibilityOf(p *pools.Pool, nodes []*v1.Node, plan func(*v1.Node) planner.Node, kubeProxyDown func(node string) bool) metav1.Condition {
	c := metav1.Condition{Type: PoolNodesEligible, ObservedGeneration: p.Generation}
	if !p.Valid() {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "InvalidSpec", "The pool is announced from no node: "+pools.Problems(p.Problems)
		return c
	}
	var eligible, excluded, unreachable, proxyDown []string
	matching := 0
	for _, n := range nodes {
		if sel := p.Announce.NodeSelector; sel != nil && !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		matching++
		pn := plan(n)
		switch {
		case pn.Excluded && kubeProxyDown(n.Name):
			proxyDown = append(proxyDown, n.Name)
		case pn.Excluded:
			excluded = append(excluded, n.Name)
		case !pn.AgentReachable:
			unreachable = append(unreachable, n.Name)
		default:
			eligible = append(eligible, n.Name)
		}
	}
	switch {
	case len(eligible) > 0:
		c.Status, c.Reason = metav1.ConditionTrue, "Eligible"
		c.Message = fmt.Sprintf("%d of %d nodes may announce: %s", len(eligible), len(nodes), short(eligible))
		if len(excluded) > 0 {
			c.Message += fmt.Sprintf("; excluded (label %s, being deleted or drained): %s", desired.LabelExcludeLB, short(excluded))
		}
		if len(proxyDown) > 0 {
			c.Message += "; kube-proxy not healthy: " + short(proxyDown)
		}
	case matching == 0:
		c.Status, c.Reason = metav1.ConditionFalse, "NoNodeMatches"
		c.Message = fmt.Sprintf("No node matches spec.announce.nodeSelector (%d nodes); its addresses are given out but answered by no one", len(nodes))
	default:
		c.Status, c.Reason = metav1.ConditionFalse, report.ReasonNoEligibleNode
		var why []string
		if len(excluded) > 0 {
			why = append(why, fmt.Sprintf("excluded by the label %s (kubeadm sets it on control-plane nodes), being deleted or drained: %s", desired.LabelExcludeLB, short(excluded)))
		}
		if len(unreachable) > 0 {
			why = append(why, "agent unreachable: "+short(unreachable))
		}
		if len(proxyDown) > 0 {
			why = append(why, "kube-proxy not healthy (DataPlaneNotReady Events on the nodes): "+short(proxyDown))
		}
		c.Message = "No node may announce the pool's addresses: " + strings.Join(why, "; ") +
			". Remove the label from the nodes that should announce, or run the agents there"
	}
	return c
}

func short(names []string) string {
	if len(names) > 8 {
		return strings.Join(names[:8], ", ") + fmt.Sprintf(" and %d more", len(names)-8)
	}
	return strings.Join(names, ", ")
}

// writePeerConditions sets each peer's Accepted condition.
func (a *Announcer) writePeerConditions() {
	s := &a.loop
	conflicts := map[string][]desired.PeerConflict{}
	for _, cs := range s.conflicts {
		for _, c := range cs {
			conflicts[c.Peer] = append(conflicts[c.Peer], c)
		}
	}
	for _, p := range s.set.Peers() {
		c := metav1.Condition{Type: PeerAccepted, Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: p.Generation}
		var nodes []string
		for _, n := range s.nodeList {
			if p.Selects(n.Labels) {
				nodes = append(nodes, n.Name)
			}
		}
		var refused []string
		for _, node := range nodes {
			if it := a.refusals.peers[node][agentapi.PeerKey(p.Session)]; it != nil {
				refused = append(refused, fmt.Sprintf("%s: %s: %s", node, it.GetField(), it.GetReason()))
			}
		}
		var dupNodes []string
		older := ""
		for _, pc := range conflicts[p.Name] {
			dupNodes = append(dupNodes, pc.Node)
			older = pc.Older
		}
		pwProblem := ""
		if p.Valid() {
			pwProblem = a.passwordProblem(p)
		}
		_, lastKnown := s.passwords[p.Name]
		switch {
		case !p.Valid():
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, "InvalidSpec", pools.Problems(p.Problems)+"; no node runs this session until fixed"
		case pwProblem != "" && !lastKnown:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, "PasswordUnreadable", pwProblem+"; the session stays down: it never runs without its password"
		case len(dupNodes) > 0:
			slices.Sort(dupNodes)
			c.Status, c.Reason = metav1.ConditionFalse, "DuplicateAddress"
			what := "the address " + p.Session.GetAddress()
			if p.Session.GetInterface() != "" {
				what = "the unnumbered interface " + p.Session.GetInterface()
			}
			c.Message = fmt.Sprintf("On %s the older BGPPeer %s has %s too, and one session per address (or interface) runs on a node; give the two peers disjoint nodeSelectors or remove one", short(dupNodes), older, what)
		case len(refused) > 0:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, "RefusedByAgent", "Agents refused the session: "+strings.Join(refused, "; ")
		case pwProblem != "":
			c.Message = fmt.Sprintf("Sessions on %d nodes with the last password read (%s)", len(nodes), pwProblem)
		default:
			c.Message = fmt.Sprintf("Sessions on %d nodes: %s", len(nodes), short(nodes))
		}
		a.setStatus(objects.KindPeer, p.Name, p.Generation, []metav1.Condition{c})
	}
	s.forgetStatus(objects.KindPeer+"/", func(name string) bool {
		return slices.ContainsFunc(s.set.Peers(), func(p *pools.Peer) bool { return p.Name == name })
	})
	klog.V(4).InfoS("Peer conditions written", "peers", len(s.set.Peers()))
}
