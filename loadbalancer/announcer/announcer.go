package announcer

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/version"
	"github.com/metalvip/metalvip/loadbalancer/agentclient"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	"github.com/metalvip/metalvip/loadbalancer/report"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Fence gives this leader's term, a fencing token that only the leader Lease can make grow
// (package provider implements it): agents refuse states of a lower term than they hold.
type Fence interface {
	// Term is the current term.
	Term() uint64
	// Raise makes the term greater than above, through the Lease, and only while this process
	// holds it; it returns the new term.
	Raise(ctx context.Context, above uint64) (uint64, error)
}

// Config configures the Announcer.
type Config struct {
	Client   kubernetes.Interface
	Dynamic  dynamic.Interface
	Recorder record.EventRecorder
	// objects.Objects are the decoded pools and peers, shared with the allocator.
	Objects *objects.Objects
	// Serves says which Services are metalvip's.
	Serves desired.Serves
	Agents agentclient.Config
	// Options are the node-wide settings every state carries (timers, ports).
	Options       desired.Options
	MaxCandidates int
	// PasswordNamespace is the only namespace BGP password Secrets are read from.
	PasswordNamespace string
	// Drain says which nodes are being drained, and for how long they keep announcing.
	Drain desired.Drain
	// Settle is how long changes are collected before they are planned and pushed.
	Settle time.Duration
	// Discover bounds the wait, at start, for every agent to say what it holds: the first
	// plan keeps it, so a CCM restart or a leader change moves no VIP. 0 means 6 s.
	Discover time.Duration
	// report.Pacer holds Services' Announced conditions back while allocations are being written
	// (the Service controller's); nil writes them at once.
	Pacer *report.Pacer
	// Records answers which pool each held address was given from (the allocator, whose
	// Ready the first plan waits for). nil: the pool whose ranges hold the address.
	Records Records
	// EgressClusterCIDRs are the destinations pods reach as themselves (cloud-config
	// egress.clusterCIDRs); none: egress is refused.
	EgressClusterCIDRs []netip.Prefix
}

// Records is the allocator's record of addresses, as the announcer reads it.
type Records interface {
	// PoolOf is ipam.Allocator.PoolOf.
	PoolOf(netip.Addr) (pool string, held bool)
	// Ready is closed once the record is rebuilt from the cluster after a start.
	Ready() <-chan struct{}
}

// Announcer decides who announces every allocated address (through the planner) and pushes
// each node's part to its agent. It is a thin loop over what changed: informer handlers only
// note keys (a Service, a pool, the nodes, the peers), and each round re-plans the addresses
// of the noted Services and pools alone, rebuilds the states of the nodes whose part changed,
// and writes each Service's metalvip.io/Announced condition when it changes. The decisions
// are in the pure packages planner and desired.
type Announcer struct {
	cfg    Config
	fence  Fence
	agents *agentclient.Agents // made by Run
	// heldPeers answers agents.HeldPeers (tests give what the agents hold without agents).
	heldPeers func(node string) []string

	services  corelisters.ServiceLister
	nodes     corelisters.NodeLister
	endpoints discoverylisters.EndpointSliceLister
	secrets   corelisters.SecretLister
	records   cache.Indexer // ServiceAnnouncements as heldRecords (record.go); nil: none written
	// recordsSynced reports whether the records are listed (their CRD served): none is
	// written before.
	recordsSynced cache.InformerSynced
	synced        []cache.InformerSynced
	secretsF      informers.SharedInformerFactory

	mu      sync.Mutex // guards pending
	pending changes
	kick    chan struct{}

	writer   *report.Writer
	tell     *teller   // the Events of the plan's changes; the run goroutine's
	drains   *drains   // the nodes being drained; the run goroutine's
	refusals *refusals // what the agents refuse; the run goroutine's
	loop     loopState // report.Owned by the run goroutine
}

// changes are what the handlers noted since the last round.
type changes struct {
	services map[string]bool
	pools    map[string]bool
	records  map[string]bool // Services whose ServiceAnnouncement changed
	// allRecords: the records are listed (at start, or once their CRD is served): every
	// Service's is compared with the plan.
	allRecords bool
	nodes      bool
	peers      bool // peers or their password Secrets
	keys       bool // a node's heartbeat keys
	reach      map[string]bool
	applied    map[string]bool // nodes whose agents acknowledged a state of this leader
	refused    map[string]refusal
	tookOver   []tookOver
	newerTerm  uint64
	sessions   map[string][]*agentv1.PeerStatus // node -> its BGP sessions, as reported
	// controlPlane: node -> the control-plane VIP its agent reports serving (invalid: none)
	controlPlane map[string]netip.Addr
	// dataPlane: node -> what its agent says of its kube-proxy (nil: not checked)
	dataPlane map[string]*agentv1.DataPlane
}

type refusal struct {
	items []*agentv1.Refusal
	whole string
}

type tookOver struct {
	node string
	ev   *agentv1.Event
}

func newChanges() changes {
	return changes{services: map[string]bool{}, pools: map[string]bool{}, records: map[string]bool{}, reach: map[string]bool{}, applied: map[string]bool{}, refused: map[string]refusal{}, sessions: map[string][]*agentv1.PeerStatus{},
		controlPlane: map[string]netip.Addr{}, dataPlane: map[string]*agentv1.DataPlane{}}
}

// New returns an announcer; Register and Run make it work.
func New(cfg Config) *Announcer {
	if cfg.Settle <= 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.Discover <= 0 {
		cfg.Discover = 6 * time.Second
	}
	a := &Announcer{cfg: cfg, pending: newChanges(), kick: make(chan struct{}, 1), writer: report.NewWriter("metalvip-announcer-status", cfg.Pacer)}
	a.loop = newLoopState(cfg.MaxCandidates, cfg.Records)
	a.tell = newTeller(cfg.Recorder)
	a.refusals = newRefusals()
	a.drains = newDrains(cfg.Drain.Delay, func() { a.note(func(c *changes) { c.nodes = true }) })
	return a
}

func (a *Announcer) newAgents(term uint64) *agentclient.Agents {
	if a.heldPeers == nil {
		a.heldPeers = func(node string) []string { return a.agents.HeldPeers(node) }
	}
	return agentclient.New(a.cfg.Agents, term, agentclient.Hooks{
		Reachability: func(node string, ok bool) {
			a.note(func(c *changes) { c.reach[node] = ok })
		},
		Event: func(node string, ev *agentv1.Event) {
			if ev.GetKind() == agentv1.Event_KIND_TOOK_OVER {
				a.note(func(c *changes) { c.tookOver = append(c.tookOver, tookOver{node, ev}) })
			}
		},
		Refused: func(node string, items []*agentv1.Refusal, whole string) {
			a.note(func(c *changes) { c.refused[node] = refusal{items, whole} })
		},
		Applied: func(node string) {
			a.note(func(c *changes) { c.applied[node] = true })
		},
		Keys: func(string, [][]byte) { a.note(func(c *changes) { c.keys = true }) },
		NewerTerm: func(_ string, held uint64) {
			a.note(func(c *changes) { c.newerTerm = max(c.newerTerm, held) })
		},
		Sessions: func(node string, sessions []*agentv1.PeerStatus) {
			a.note(func(c *changes) { c.sessions[node] = sessions })
		},
		ControlPlane: func(node string, vip netip.Addr) {
			a.note(func(c *changes) { c.controlPlane[node] = vip })
		},
		Build: a.agentBuild,
		DataPlane: func(node string, dp *agentv1.DataPlane) {
			a.note(func(c *changes) { c.dataPlane[node] = dp })
		},
	})
}

// ccmVersion is this CCM's version (a variable for the tests, whose build is a development one).
var ccmVersion = func() string { return agentapi.ThisBuild().GetVersion() }

// agentBuild warns, on the Node and in the log, of an agent whose version may not run with
// this CCM's (docs/upgrading.md; `metalvipctl version` shows every pair). Said once per build
// the agent says it is: nothing else changes, the CCM keeps talking to it.
func (a *Announcer) agentBuild(node string, b *agentv1.Build) {
	me, agent := ccmVersion(), version.Printable(b.GetVersion())
	skew := version.Skew(me, agent)
	if !version.Unsupported(skew) {
		return
	}
	klog.InfoS("WARNING: an agent's version may not run with this CCM's; upgrade it (docs/upgrading.md)", "node", node, "agent", agent, "ccm", me, "skew", skew)
	// UID: the node's name, as the kubelet's Events and `kubectl describe node` have it.
	a.cfg.Recorder.Eventf(&v1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}, v1.EventTypeWarning, report.ReasonAgentVersionSkew,
		"metalvip-agent %s on %s and the CCM %s: %s; upgrade the older of the two (docs/upgrading.md)", agent, node, me, skew)
}

// Register adds the informers the announcer needs to the factories (which the caller
// starts), and a factory of its own for the password Secrets of one namespace (started by Run).
func (a *Announcer) Register(factory informers.SharedInformerFactory, dyn dynamicinformer.DynamicSharedInformerFactory) {
	svc := factory.Core().V1().Services()
	nodes := factory.Core().V1().Nodes()
	eps := factory.Discovery().V1().EndpointSlices()
	a.services, a.nodes, a.endpoints = svc.Lister(), nodes.Lister(), eps.Lister()
	a.cfg.Objects.Register(dyn)
	a.cfg.Objects.Subscribe(func(c objects.Change) {
		a.note(func(ch *changes) {
			if c.Pool != "" {
				ch.pools[c.Pool] = true
			}
			if c.Peer != "" {
				ch.peers = true
			}
		})
	})

	_, _ = svc.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.serviceChanged,
		UpdateFunc: func(_, o any) { a.serviceChanged(o) },
		DeleteFunc: a.serviceChanged,
	})
	_, _ = eps.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.endpointsChanged,
		UpdateFunc: func(_, o any) { a.endpointsChanged(o) },
		DeleteFunc: a.endpointsChanged,
	})
	_, _ = nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { a.note(func(c *changes) { c.nodes = true }) },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*v1.Node)
			nn, ok2 := n.(*v1.Node)
			if ok1 && ok2 && desired.SameNode(on, nn) {
				return // the kubelet's heartbeats: nothing the plan depends on
			}
			a.note(func(c *changes) { c.nodes = true })
		},
		DeleteFunc: func(any) { a.note(func(c *changes) { c.nodes = true }) },
	})
	synced := []cache.InformerSynced{svc.Informer().HasSynced, nodes.Informer().HasSynced, eps.Informer().HasSynced, a.cfg.Objects.HasSynced}
	// ServiceAnnouncements: not a condition of the plan. Where their CRD is not served yet (an
	// install that applies it with the CCM; an upgrade by Helm, which leaves out a chart's new
	// CRDs) the loop announces all the same and writes the records once it is.
	rec := dyn.ForResource(v1alpha1.ServiceAnnouncementResource)
	if err := rec.Informer().SetTransform(compactRecord); err != nil {
		klog.ErrorS(err, "The ServiceAnnouncements' informer started before the announcer could compact its objects")
	}
	// The indexer, not rec.Lister(): compactRecord stores heldRecords.
	a.records = rec.Informer().GetIndexer()
	a.recordsSynced = rec.Informer().HasSynced
	_, _ = rec.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.recordChanged,
		UpdateFunc: func(_, o any) { a.recordChanged(o) },
		DeleteFunc: a.recordChanged,
	})
	if a.cfg.PasswordNamespace != "" {
		a.secretsF = informers.NewSharedInformerFactoryWithOptions(a.cfg.Client, 0, informers.WithNamespace(a.cfg.PasswordNamespace))
		sec := a.secretsF.Core().V1().Secrets()
		a.secrets = sec.Lister()
		_, _ = sec.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { a.note(func(c *changes) { c.peers = true }) },
			UpdateFunc: func(any, any) { a.note(func(c *changes) { c.peers = true }) },
			DeleteFunc: func(any) { a.note(func(c *changes) { c.peers = true }) },
		})
		synced = append(synced, sec.Informer().HasSynced)
	}
	a.synced = synced
}

// note records a change and wakes the loop.
func (a *Announcer) note(f func(*changes)) {
	a.mu.Lock()
	f(&a.pending)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Announcer) take() changes {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.pending
	a.pending = newChanges()
	return c
}

// recordChanged notes a Service whose ServiceAnnouncement changed: the round compares it with
// the plan (nothing is planned again).
func (a *Announcer) recordChanged(o any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
		a.note(func(c *changes) { c.records[key] = true })
	}
}

func (a *Announcer) serviceChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	s, ok := o.(*v1.Service)
	if !ok {
		return
	}
	key := desired.Key(s)
	a.note(func(c *changes) { c.services[key] = true })
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
	if err != nil {
		return
	}
	if egress, _ := desired.EgressAsk(svc); !desired.Local(svc) && !egress {
		return // only Local Services and egress depend on where endpoints run
	}
	key := desired.Key(svc)
	a.note(func(c *changes) { c.services[key] = true })
}

// Run works until ctx ends: it waits for the caches, learns what the agents hold (the first
// plan keeps it), then plans and pushes every change, under the term fence gives. Every
// goroutine it starts ends with ctx.
func (a *Announcer) Run(ctx context.Context, fence Fence) {
	a.fence = fence
	a.agents = a.newAgents(fence.Term())
	defer a.agents.Close()
	defer a.drains.stop()
	if a.secretsF != nil {
		a.secretsF.Start(ctx.Done())
		defer a.secretsF.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return
	}
	if a.cfg.Records != nil {
		// An address's pool is the allocator's record: before it is rebuilt every held
		// address would look poolless and be withdrawn.
		select {
		case <-ctx.Done():
			return
		case <-a.cfg.Records.Ready():
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.writer.Run(ctx, 2) }()
	defer wg.Wait()
	if a.recordsSynced != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.awaitRecords(ctx) }()
	}

	// Nothing is pushed before the agents said what they hold: a plan made without it could
	// move VIPs that are well placed, or withdraw them while agents seem unreachable.
	a.loop.refreshNodes(a)
	start := time.Now()
	held := a.agents.Discover(ctx, a.loop.addrs, a.cfg.Discover)
	a.agents.SeeKeys(held)
	a.loop.seed = seedPlan(held)
	// The first plan sees the reachability Discover decided, not only what the hooks noted
	// by then: a hook noted after the first plan would count as a node returning, and a
	// node returning rebalances (moves VIPs a new leader must keep).
	for _, n := range a.loop.nodeList {
		a.loop.reachable[n.Name] = a.agents.Reachable(n.Name)
	}
	// A node cut off before this CCM led stays heartbeated by the nodes that did so.
	a.loop.cutOff.seed(held, a.agents.Reachable)
	klog.InfoS("Learnt what the agents announce", "agents", len(held), "nodes", len(a.loop.nodeList), "vips", len(a.loop.seed), "duration", time.Since(start).Round(time.Millisecond))
	a.note(func(c *changes) { c.nodes = true })
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		}
		// Let a burst of changes arrive before planning.
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.cfg.Settle):
		}
		a.sync(ctx, a.take())
	}
}

// raiseTerm raises this leader's term above what an agent holds, through the Lease.
func (a *Announcer) raiseTerm(ctx context.Context, above uint64) {
	t, err := a.fence.Raise(ctx, above)
	if err != nil {
		klog.ErrorS(err, "An agent holds a newer term than this leader's, and raising the term failed; retrying on the next refusal", "held", above, "term", a.agents.Term())
		return
	}
	klog.InfoS("Raised the term above one an agent held", "held", above, "term", t)
	a.agents.SetTerm(t)
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
