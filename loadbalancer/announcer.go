package loadbalancer

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"google.golang.org/protobuf/proto"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Event reasons of announcing.
const (
	ReasonAnnounced        = "Announced"
	ReasonTookOver         = "TookOver"
	ReasonAgentUnreachable = "AgentUnreachable"
	ReasonAgentReachable   = "AgentReachable"
	ReasonVIPsShareNodes   = "VIPsShareNodes"
	ReasonVIPsSpread       = "VIPsSpread"
)

// Labels and taints that make a node ineligible to announce.
const (
	labelExcludeLB = "node.kubernetes.io/exclude-from-external-load-balancers"
	taintToDelete  = "ToBeDeletedByClusterAutoscaler"
)

// AnnouncerConfig configures the Announcer.
type AnnouncerConfig struct {
	Client   kubernetes.Interface
	Recorder record.EventRecorder
	Agents   AgentConfig
	// Term is this leader's term, sent with every state so that a deposed leader is fenced.
	Term uint64
	// HeartbeatKeys, HeartbeatInterval, HeartbeatMisses, HeartbeatPort configure the agents'
	// failover; GratuitousRefresh their re-announcing.
	HeartbeatKeys     [][]byte
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	HeartbeatPort     int
	GratuitousRefresh time.Duration
	MaxCandidates     int
	// Settle is how long changes are collected before they are planned and pushed.
	Settle time.Duration
	// Discover bounds the wait, at start, for every agent to say what it holds: the first
	// plan keeps it, so a CCM restart or a leader change moves no VIP. 0 means 6 s.
	Discover time.Duration
}

// Announcer decides who announces every allocated address (through the planner) and pushes
// each node's part to its agent. It reacts to the change at hand: a Service or its endpoints
// re-plan that Service's addresses only; nodes, agents' reachability and pools re-plan all.
type Announcer struct {
	cfg    AnnouncerConfig
	agents *Agents

	services  corelisters.ServiceLister
	nodes     corelisters.NodeLister
	endpoints discoverylisters.EndpointSliceLister
	pools     cache.GenericLister
	peers     cache.GenericLister
	synced    []cache.InformerSynced

	mu          sync.Mutex
	planner     *planner.Planner
	dirtyVIPs   map[netip.Addr]bool
	dirtyAll    bool                  // nodes, reachability, pools or peers changed
	announced   map[netip.Addr]string // last announcing summary per VIP, for Events
	primaries   map[netip.Addr]string // last primary per L2 VIP, for the why of Events
	reachable   map[string]bool
	kick        chan struct{}
	lastPushed  map[string]*agentv1.DesiredState
	vipServices map[netip.Addr][]*v1.Service
	groupMsg    map[string]string // last VIPsShareNodes message per group
	// seed is what the agents held when this announcer started; the first full plan keeps
	// it where balance allows, then it is dropped.
	seed planner.Plan
}

// NewAnnouncer returns an announcer; Start makes it work.
func NewAnnouncer(cfg AnnouncerConfig) *Announcer {
	if cfg.Settle <= 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.Discover <= 0 {
		cfg.Discover = 6 * time.Second
	}
	return &Announcer{
		cfg:         cfg,
		planner:     planner.New(planner.Options{MaxCandidates: cfg.MaxCandidates}),
		dirtyVIPs:   map[netip.Addr]bool{},
		announced:   map[netip.Addr]string{},
		primaries:   map[netip.Addr]string{},
		reachable:   map[string]bool{},
		kick:        make(chan struct{}, 1),
		lastPushed:  map[string]*agentv1.DesiredState{},
		vipServices: map[netip.Addr][]*v1.Service{},
		groupMsg:    map[string]string{},
	}
}

// Start registers informers with the factories (which the caller starts) and runs until ctx
// ends.
func (a *Announcer) Start(ctx context.Context, factory informers.SharedInformerFactory, dyn dynamicinformer.DynamicSharedInformerFactory) {
	a.agents = NewAgents(ctx, a.cfg.Agents, a.cfg.Term, a.agentReachability, a.agentEvent)
	svc := factory.Core().V1().Services()
	nodes := factory.Core().V1().Nodes()
	eps := factory.Discovery().V1().EndpointSlices()
	pools := dyn.ForResource(v1alpha1.IPPoolResource)
	peers := dyn.ForResource(v1alpha1.BGPPeerResource)
	a.services, a.nodes, a.endpoints = svc.Lister(), nodes.Lister(), eps.Lister()
	a.pools, a.peers = pools.Lister(), peers.Lister()

	_, _ = svc.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.serviceChanged(nil, o) },
		UpdateFunc: a.serviceChanged,
		DeleteFunc: func(o any) { a.serviceChanged(o, nil) },
	})
	_, _ = eps.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.endpointsChanged,
		UpdateFunc: func(_, o any) { a.endpointsChanged(o) },
		DeleteFunc: a.endpointsChanged,
	})
	all := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.markAll() },
		UpdateFunc: func(o, n any) { a.markAll() },
		DeleteFunc: func(any) { a.markAll() },
	}
	_, _ = nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.markAll() },
		UpdateFunc: a.nodeChanged,
		DeleteFunc: func(any) { a.markAll() },
	})
	_, _ = pools.Informer().AddEventHandler(all)
	_, _ = peers.Informer().AddEventHandler(all)
	a.synced = []cache.InformerSynced{svc.Informer().HasSynced, nodes.Informer().HasSynced, eps.Informer().HasSynced, pools.Informer().HasSynced, peers.Informer().HasSynced}
	go a.run(ctx)
}

func (a *Announcer) run(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return
	}
	// Nothing is pushed before the agents said what they hold: a plan made without it
	// could move VIPs that are well placed, or withdraw them while agents seem unreachable.
	nodeList, _ := a.nodes.List(labels.Everything())
	a.agents.SetNodes(nodeAddresses(nodeList))
	start := time.Now()
	held := a.agents.Discover(ctx, a.cfg.Discover)
	seed := seedPlan(held)
	klog.InfoS("Learnt what the agents announce", "agents", len(held), "nodes", len(nodeList), "vips", len(seed), "duration", time.Since(start).Round(time.Millisecond))
	a.mu.Lock()
	a.seed = seed
	a.mu.Unlock()
	a.markAll()
	for {
		select {
		case <-ctx.Done():
			a.agents.Close()
			return
		case <-a.kick:
		}
		// Let a burst of changes arrive before planning.
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.cfg.Settle):
		}
		a.sync()
	}
}

func (a *Announcer) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Announcer) markAll() {
	a.mu.Lock()
	a.dirtyAll = true
	a.mu.Unlock()
	a.poke()
}

func (a *Announcer) markVIPs(ips []netip.Addr) {
	if len(ips) == 0 {
		return
	}
	a.mu.Lock()
	for _, ip := range ips {
		a.dirtyVIPs[ip] = true
	}
	a.mu.Unlock()
	a.poke()
}

func (a *Announcer) serviceChanged(oldObj, newObj any) {
	var ips []netip.Addr
	for _, o := range []any{oldObj, newObj} {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if s, ok := o.(*v1.Service); ok {
			ips = append(ips, statusIPs(s)...)
		}
	}
	a.markVIPs(ips)
}

func (a *Announcer) endpointsChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	es, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	name := es.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return
	}
	svc, err := a.services.Services(es.Namespace).Get(name)
	if err != nil || svc.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		return // only Local Services depend on where endpoints run
	}
	a.markVIPs(statusIPs(svc))
}

func (a *Announcer) nodeChanged(oldObj, newObj any) {
	o, ok1 := oldObj.(*v1.Node)
	n, ok2 := newObj.(*v1.Node)
	if ok1 && ok2 && nodeView(o) == nodeView(n) {
		return // heartbeats of the kubelet: nothing the plan depends on
	}
	a.markAll()
}

// nodeView is what the plan depends on of a node.
func nodeView(n *v1.Node) string {
	var b strings.Builder
	keys := make([]string, 0, len(n.Labels))
	for k := range n.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s,", k, n.Labels[k])
	}
	fmt.Fprintf(&b, "|%v|%v|", n.DeletionTimestamp != nil, nodeAddress(n))
	for _, t := range n.Spec.Taints {
		b.WriteString(t.Key + ";")
	}
	return b.String()
}

func (a *Announcer) agentReachability(node string, ok bool) {
	a.mu.Lock()
	a.reachable[node] = ok
	a.mu.Unlock()
	if n, err := a.nodes.Get(node); err == nil {
		if ok {
			a.cfg.Recorder.Eventf(n, v1.EventTypeNormal, ReasonAgentReachable, "The CCM reaches metalvip-agent on %s", node)
		} else {
			a.cfg.Recorder.Eventf(n, v1.EventTypeWarning, ReasonAgentUnreachable,
				"The CCM cannot reach metalvip-agent on %s; the node takes no new VIPs until it can (check the agent pod, its TLS certificate and port %d)", node, a.cfg.Agents.Port)
		}
	}
	a.markAll()
}

// agentEvent turns an agent's take-over into an Event on the Services of the VIP.
func (a *Announcer) agentEvent(node string, ev *agentv1.Event) {
	if ev.GetKind() != agentv1.Event_KIND_TOOK_OVER {
		return
	}
	vip, err := netip.ParseAddr(ev.GetVip())
	if err != nil {
		return
	}
	a.mu.Lock()
	svcs := slices.Clone(a.vipServices[vip])
	a.mu.Unlock()
	for _, s := range svcs {
		a.cfg.Recorder.Eventf(s, v1.EventTypeNormal, ReasonTookOver, "Node %s answers for %s now: %s", node, vip, ev.GetDetail())
	}
}

// seedPlan is the plan the agents' states describe: for each L2 VIP the candidates of the
// newest state (highest term; within a term, generations count per node, so the primary's
// own copy wins), for a BGP VIP the nodes that advertise it.
func seedPlan(held map[string]*agentv1.DesiredState) planner.Plan {
	type source struct {
		term    uint64
		primary bool
	}
	plan := planner.Plan{}
	from := map[netip.Addr]source{}
	for _, node := range slices.Sorted(maps.Keys(held)) {
		st := held[node]
		for _, an := range st.GetAnnouncements() {
			ip, err := netip.ParseAddr(an.GetVip())
			if err != nil {
				continue
			}
			if an.GetMode() == agentv1.Mode_MODE_BGP {
				e := plan[ip]
				e.Mode = planner.BGP
				e.Nodes = append(e.Nodes, node)
				plan[ip] = e
				continue
			}
			e := planner.Entry{Mode: planner.L2}
			for _, c := range an.GetL2().GetCandidates() {
				e.Nodes = append(e.Nodes, c.GetNode())
			}
			src := source{st.GetTerm(), e.Primary() == node}
			if old, ok := from[ip]; ok && (old.term > src.term || old.term == src.term && (old.primary || !src.primary)) {
				continue
			}
			from[ip] = src
			plan[ip] = e
		}
	}
	return plan
}

// nodeAddresses maps each node to its data-plane address.
func nodeAddresses(nodes []*v1.Node) map[string]netip.Addr {
	addrs := make(map[string]netip.Addr, len(nodes))
	for _, n := range nodes {
		addrs[n.Name] = nodeAddress(n)
	}
	return addrs
}

// nodeAddress is the node's data-plane address: its first InternalIP, IPv4 first.
func nodeAddress(n *v1.Node) netip.Addr {
	var v6 netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != v1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		if ip.Is4() {
			return ip
		}
		if !v6.IsValid() {
			v6 = ip
		}
	}
	return v6
}

// sync plans what changed and pushes the nodes whose state changed.
func (a *Announcer) sync() {
	a.mu.Lock()
	dirty, all := a.dirtyVIPs, a.dirtyAll
	a.dirtyVIPs, a.dirtyAll = map[netip.Addr]bool{}, false
	reachable := make(map[string]bool, len(a.reachable))
	for k, v := range a.reachable {
		reachable[k] = v
	}
	a.mu.Unlock()

	nodeList, _ := a.nodes.List(labels.Everything())
	pools := a.poolMap()
	vips, vipServices, vipPools := a.vipsFromServices(pools)

	addrs := nodeAddresses(nodeList)
	var pnodes []planner.Node
	for _, n := range nodeList {
		_, excluded := n.Labels[labelExcludeLB]
		for _, t := range n.Spec.Taints {
			if t.Key == taintToDelete {
				excluded = true
			}
		}
		pnodes = append(pnodes, planner.Node{
			Name: n.Name, Labels: n.Labels,
			Excluded:       excluded || n.DeletionTimestamp != nil,
			AgentReachable: reachable[n.Name],
		})
	}
	a.agents.SetNodes(addrs)

	a.mu.Lock()
	a.vipServices = vipServices
	var changed []netip.Addr
	if all && a.seed != nil {
		list := make([]planner.VIP, 0, len(vips))
		for _, v := range vips {
			list = append(list, v)
		}
		a.planner.Reset(a.seed, list, pnodes)
		a.seed = nil
		for ip := range a.planner.Plan() {
			changed = append(changed, ip)
		}
	} else if all {
		a.planner.SetNodes(pnodes)
		for ip := range a.planner.Plan() {
			if _, ok := vips[ip]; !ok {
				a.planner.DeleteVIP(ip)
			}
		}
		for _, v := range vips {
			a.planner.SetVIP(v)
		}
		for ip := range a.planner.Plan() {
			changed = append(changed, ip)
		}
	} else {
		for ip := range dirty {
			if v, ok := vips[ip]; ok {
				a.planner.SetVIP(v)
			} else {
				a.planner.DeleteVIP(ip)
			}
			changed = append(changed, ip)
		}
	}
	plan := a.planner.Plan()
	events := a.announceEvents(changed, plan, vipServices, vipPools)
	events = append(events, a.groupEvents(plan, vips, vipServices)...)
	a.mu.Unlock()
	for _, e := range events {
		reason, kind := e.reason, v1.EventTypeNormal
		if reason == "" {
			reason = ReasonAnnounced
		}
		if reason == ReasonVIPsShareNodes {
			kind = v1.EventTypeWarning
		}
		a.cfg.Recorder.Eventf(e.svc, kind, reason, "%s", e.msg)
	}

	// Each node's state. Building them all is O(VIPs): cheap next to pushing, and a node is
	// pushed only when its state differs from the last pushed.
	states := a.nodeStates(plan, vips, vipPools, nodeList, addrs)
	for _, n := range nodeList {
		st := states[n.Name]
		if last, ok := a.lastPushed[n.Name]; ok && protoEqual(last, st) {
			continue
		}
		a.lastPushed[n.Name] = st
		a.agents.Push(n.Name, st)
	}
}

type svcEvent struct {
	svc    *v1.Service
	reason string // "" is Announced
	msg    string
}

// groupEvents says, once per change, when a Service's several addresses of one family share
// primary nodes (fewer eligible nodes than addresses), and when they no longer do. The caller
// holds a.mu.
func (a *Announcer) groupEvents(plan planner.Plan, vips map[netip.Addr]planner.VIP, vipServices map[netip.Addr][]*v1.Service) []svcEvent {
	members := map[string][]netip.Addr{}
	for ip, v := range vips {
		if v.Group != "" && v.Mode == planner.L2 {
			members[v.Group] = append(members[v.Group], ip)
		}
	}
	var out []svcEvent
	for g, ips := range members {
		slices.SortFunc(ips, netip.Addr.Compare)
		byNode := map[string][]string{}
		var nodes []string
		for _, ip := range ips {
			pr := plan[ip].Primary()
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
		msg, reason := "", ""
		if len(shared) > 0 {
			reason = ReasonVIPsShareNodes
			msg = fmt.Sprintf("%d addresses on %d nodes: fewer nodes are eligible than addresses, so some share a node (%s); they spread when more nodes become eligible", len(ips), len(nodes), strings.Join(shared, "; "))
		} else if a.groupMsg[g] != "" {
			reason = ReasonVIPsSpread
			msg = fmt.Sprintf("%d addresses on %d distinct nodes", len(ips), len(nodes))
		}
		if msg == "" || a.groupMsg[g] == msg {
			continue
		}
		if reason == ReasonVIPsSpread {
			delete(a.groupMsg, g)
		} else {
			a.groupMsg[g] = msg
		}
		if svcs := vipServices[ips[0]]; len(svcs) > 0 {
			out = append(out, svcEvent{svc: svcs[0], reason: reason, msg: msg})
		}
	}
	for g := range a.groupMsg {
		if _, ok := members[g]; !ok {
			delete(a.groupMsg, g)
		}
	}
	return out
}

// announceEvents describes, once per change, who announces each changed VIP. The caller
// holds a.mu.
func (a *Announcer) announceEvents(changed []netip.Addr, plan planner.Plan, vipServices map[netip.Addr][]*v1.Service, vipPools map[netip.Addr]*v1alpha1.IPPool) []svcEvent {
	var out []svcEvent
	for _, ip := range changed {
		e, ok := plan[ip]
		if !ok {
			delete(a.announced, ip)
			delete(a.primaries, ip)
			continue
		}
		var msg string
		switch {
		case len(e.Nodes) == 0:
			msg = fmt.Sprintf("No node may announce %s: none is eligible (node selector, excluded nodes, unreachable agents, or no ready local endpoint)", ip)
		case e.Mode == planner.L2 && perClient(vipPools[ip]):
			// Every candidate answers its share of the clients: no standby.
			msg = fmt.Sprintf("%s (L2 per client) is answered by %s (each for its share of clients)", ip, strings.Join(slices.Sorted(slices.Values(e.Nodes)), ", "))
			a.primaries[ip] = e.Nodes[0]
		case e.Mode == planner.L2:
			msg = fmt.Sprintf("%s (L2) is answered by %s", ip, e.Nodes[0])
			if len(e.Nodes) > 1 {
				msg += ", standby " + strings.Join(e.Nodes[1:], ", ")
			}
			switch prev := a.primaries[ip]; {
			case prev == "" || prev == e.Nodes[0]:
			case !slices.Contains(e.Nodes, prev):
				msg += fmt.Sprintf(" (was %s, which may no longer announce it: excluded, its agent unreachable, or no local endpoint)", prev)
			default:
				msg += fmt.Sprintf(" (was %s; moved to keep the nodes balanced)", prev)
			}
			a.primaries[ip] = e.Nodes[0]
		default:
			msg = fmt.Sprintf("%s (BGP) is advertised by %s", ip, strings.Join(e.Nodes, ", "))
		}
		if a.announced[ip] == msg {
			continue
		}
		a.announced[ip] = msg
		for _, s := range vipServices[ip] {
			out = append(out, svcEvent{svc: s, msg: msg})
		}
	}
	return out
}

// perClient reports whether a pool's L2 VIPs are answered per client.
func perClient(pool *v1alpha1.IPPool) bool {
	return pool != nil && pool.Spec.Announce.L2 != nil && pool.Spec.Announce.L2.Spreading == v1alpha1.SpreadPerClient
}

func (a *Announcer) poolMap() map[string]*v1alpha1.IPPool {
	out := map[string]*v1alpha1.IPPool{}
	objs, _ := a.pools.List(labels.Everything())
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &v1alpha1.IPPool{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p) == nil {
			out[p.Name] = p
		}
	}
	return out
}

// vipsFromServices gathers every address in the status of a Service of ours, with what the
// planner needs. Services sharing an address make one VIP: with externalTrafficPolicy Local
// (which sharing Services have in common) the nodes with a ready endpoint of any of them may
// announce it. It also returns each address's pool.
func (a *Announcer) vipsFromServices(pools map[string]*v1alpha1.IPPool) (map[netip.Addr]planner.VIP, map[netip.Addr][]*v1.Service, map[netip.Addr]*v1alpha1.IPPool) {
	svcs, _ := a.services.List(labels.Everything())
	vips := map[netip.Addr]planner.VIP{}
	bySvc := map[netip.Addr][]*v1.Service{}
	poolOf := map[netip.Addr]*v1alpha1.IPPool{}
	var ranges []poolRange
	for _, s := range svcs {
		if !ours(s) {
			continue
		}
		ips := statusIPs(s)
		if len(ips) == 0 {
			continue
		}
		poolName, _ := annotation.AllocatedPool.Value(s)
		pool := pools[poolName]
		if pool == nil {
			// The allocation record comes a moment after the status: the pool is the one
			// holding the address.
			if ranges == nil {
				ranges = poolRanges(pools)
			}
			pool = pools[poolContaining(ranges, ips[0])]
		}
		key := serviceKey(s)
		perFamily := map[bool]int{} // by Is4
		for _, ip := range ips {
			perFamily[ip.Is4()]++
		}
		local := s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
		var endpointNodes []string
		if local {
			endpointNodes = a.readyEndpointNodes(s)
		}
		for _, ip := range ips {
			v, seen := vips[ip]
			if !seen {
				v = planner.VIP{Addr: ip, Mode: planner.L2}
				if pool != nil {
					if pool.Spec.Announce.Mode == v1alpha1.AnnounceBGP {
						v.Mode = planner.BGP
					}
					if sel := pool.Spec.Announce.NodeSelector; sel != nil {
						if ls, err := sel.AsSelector(); err == nil {
							v.NodeSelector = selector{ls}
						}
					}
					if sel := pool.Spec.Announce.PreferredNodeSelector; sel != nil {
						if ls, err := sel.AsSelector(); err == nil {
							v.Preferred = selector{ls}
						}
					}
				}
			}
			// A Service's several addresses of one family go to distinct nodes.
			if perFamily[ip.Is4()] > 1 {
				v.Group = key + "/" + ipam.FamilyOf(ip).String()
			}
			if local {
				v.Local = true
				for _, n := range endpointNodes {
					if !slices.Contains(v.EndpointNodes, n) {
						v.EndpointNodes = append(v.EndpointNodes, n)
					}
				}
				slices.Sort(v.EndpointNodes)
			}
			vips[ip] = v
			bySvc[ip] = append(bySvc[ip], s)
			if pool != nil {
				poolOf[ip] = pool
			}
		}
	}
	return vips, bySvc, poolOf
}

type poolRange struct {
	pool string
	r    ipam.Range
}

// poolRanges lists every pool's ranges.
func poolRanges(pools map[string]*v1alpha1.IPPool) []poolRange {
	out := []poolRange{}
	for name, p := range pools {
		for _, ar := range p.Spec.Addresses {
			if r, err := ipam.ParseRange(string(ar)); err == nil {
				out = append(out, poolRange{name, r})
			}
		}
	}
	return out
}

func poolContaining(ranges []poolRange, ip netip.Addr) string {
	for _, pr := range ranges {
		if pr.r.Contains(ip) {
			return pr.pool
		}
	}
	return ""
}

type selector struct{ labels.Selector }

func (s selector) Matches(m map[string]string) bool { return s.Selector.Matches(labels.Set(m)) }

func (a *Announcer) readyEndpointNodes(s *v1.Service) []string {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name})
	slices2, _ := a.endpoints.EndpointSlices(s.Namespace).List(sel)
	var out []string
	for _, es := range slices2 {
		for _, ep := range es.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if ready && ep.NodeName != nil && !slices.Contains(out, *ep.NodeName) {
				out = append(out, *ep.NodeName)
			}
		}
	}
	return out
}

// nodeStates builds every node's desired state from the plan.
func (a *Announcer) nodeStates(plan planner.Plan, vips map[netip.Addr]planner.VIP, vipPools map[netip.Addr]*v1alpha1.IPPool, nodes []*v1.Node, addrs map[string]netip.Addr) map[string]*agentv1.DesiredState {
	states := map[string]*agentv1.DesiredState{}
	refresh := uint32(a.cfg.GratuitousRefresh / time.Second)
	peers := a.bgpPeers()
	for _, n := range nodes {
		st := &agentv1.DesiredState{
			L2: &agentv1.L2Options{
				GratuitousRefreshSeconds: refresh,
				HeartbeatKeys:            a.cfg.HeartbeatKeys,
				HeartbeatIntervalMs:      uint32(a.cfg.HeartbeatInterval / time.Millisecond),
				HeartbeatMisses:          uint32(a.cfg.HeartbeatMisses),
				HeartbeatPort:            uint32(a.cfg.HeartbeatPort),
			},
		}
		if addr := addrs[n.Name]; addr.Is4() {
			st.Bgp = &agentv1.BGPOptions{RouterId: addr.String()}
		}
		for _, p := range peers {
			if p.selector != nil && !p.selector.Matches(labels.Set(n.Labels)) {
				continue
			}
			st.BgpPeers = append(st.BgpPeers, p.peer)
			if st.Bgp == nil {
				st.Bgp = &agentv1.BGPOptions{}
			}
			if st.Bgp.Asn == 0 {
				st.Bgp.Asn = p.peer.GetLocalAsn()
			}
		}
		states[n.Name] = st
	}
	ips := make([]netip.Addr, 0, len(plan))
	for ip := range plan {
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, func(x, y netip.Addr) int { return x.Compare(y) })
	svcNames := map[netip.Addr][]string{}
	for ip, svcs := range a.vipServices {
		for _, s := range svcs {
			svcNames[ip] = append(svcNames[ip], s.Namespace+"/"+s.Name)
		}
		slices.Sort(svcNames[ip])
	}
	for _, ip := range ips {
		e := plan[ip]
		v := vips[ip]
		pool := vipPools[ip]
		an := &agentv1.Announcement{Vip: ip.String(), Services: svcNames[ip]}
		if v.Mode == planner.BGP {
			an.Mode = agentv1.Mode_MODE_BGP
			an.Bgp = &agentv1.BGPAnnouncement{}
			if pool != nil && pool.Spec.Announce.BGP != nil {
				an.Bgp.Communities = pool.Spec.Announce.BGP.Communities
				if lp := pool.Spec.Announce.BGP.LocalPref; lp != nil {
					an.Bgp.LocalPref = uint32(*lp)
				}
			}
		} else {
			an.Mode = agentv1.Mode_MODE_L2
			an.L2 = &agentv1.L2Announcement{}
			for _, c := range e.Nodes {
				an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c, Address: addrs[c].String()})
			}
			if pool != nil && pool.Spec.Announce.L2 != nil {
				an.L2.Interfaces = pool.Spec.Announce.L2.Interfaces
			}
			an.L2.PerClient = perClient(pool)
		}
		for _, node := range e.Nodes {
			if st := states[node]; st != nil {
				st.Announcements = append(st.Announcements, an)
			}
		}
	}
	return states
}

type peerSpec struct {
	peer     *agentv1.BGPPeer
	selector labels.Selector
}

func (a *Announcer) bgpPeers() []peerSpec {
	objs, _ := a.peers.List(labels.Everything())
	var out []peerSpec
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &v1alpha1.BGPPeer{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p) != nil {
			continue
		}
		sp := p.Spec
		bp := &agentv1.BGPPeer{Address: sp.Address, PeerAsn: uint32(sp.PeerASN), LocalAsn: uint32(sp.MyASN), GracefulRestart: sp.GracefulRestart}
		if sp.Port != nil {
			bp.Port = uint32(*sp.Port)
		}
		if sp.HoldTimeSeconds != nil {
			bp.HoldTimeSeconds = uint32(*sp.HoldTimeSeconds)
		}
		if sp.KeepaliveSeconds != nil {
			bp.KeepaliveSeconds = uint32(*sp.KeepaliveSeconds)
		}
		if sp.EBGPMultihop != nil && *sp.EBGPMultihop > 1 {
			bp.EbgpMultihopTtl = uint32(*sp.EBGPMultihop)
		}
		if b := sp.BFD; b != nil && b.Enabled {
			bp.Bfd = &agentv1.BFD{Enabled: true}
			if b.MinRxMilliseconds != nil {
				bp.Bfd.MinRxMs = uint32(*b.MinRxMilliseconds)
			}
			if b.MinTxMilliseconds != nil {
				bp.Bfd.MinTxMs = uint32(*b.MinTxMilliseconds)
			}
			if b.Multiplier != nil {
				bp.Bfd.Multiplier = uint32(*b.Multiplier)
			}
		}
		if ref := sp.PasswordSecretRef; ref != nil {
			sec, err := a.cfg.Client.CoreV1().Secrets(ref.Namespace).Get(context.Background(), ref.Name, metav1.GetOptions{})
			if err != nil {
				klog.ErrorS(err, "BGP password Secret unreadable; the session goes without it", "peer", p.Name)
			} else {
				bp.Password = string(sec.Data[ref.Key])
			}
		}
		ps := peerSpec{peer: bp}
		if sp.NodeSelector != nil {
			if s, err := sp.NodeSelector.AsSelector(); err == nil {
				ps.selector = s
			}
		}
		out = append(out, ps)
	}
	slices.SortFunc(out, func(x, y peerSpec) int { return strings.Compare(x.peer.GetAddress(), y.peer.GetAddress()) })
	return out
}

func protoEqual(a, b *agentv1.DesiredState) bool { return proto.Equal(a, b) }
