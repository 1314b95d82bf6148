package announcer

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/planner"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func l2(vip string, candidates ...string) *agentv1.Announcement {
	an := &agentv1.Announcement{Vip: vip, Mode: agentv1.Mode_MODE_L2, L2: &agentv1.L2Announcement{}}
	for _, c := range candidates {
		an.L2.Candidates = append(an.L2.Candidates, &agentv1.Candidate{Node: c})
	}
	return an
}

func TestSeedPlanTakesTheNewestTermAndThePrimarysCopy(t *testing.T) {
	bgp := &agentv1.Announcement{Vip: "203.0.113.9", Mode: agentv1.Mode_MODE_BGP}
	held := map[string]*agentv1.DesiredState{
		// node-a missed the last push of term 7 for .1: its copy is older.
		"node-a": {Term: 6, Generation: 40, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-a", "node-b"), l2("203.0.113.2", "node-b", "node-a"), bgp}},
		"node-b": {Term: 7, Generation: 3, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-b", "node-c"), l2("203.0.113.2", "node-b", "node-a"), bgp}},
		// Same term, node-c's own copy of .3 names it primary; node-b's stale one does not.
		"node-c": {Term: 7, Generation: 9, Announcements: []*agentv1.Announcement{l2("203.0.113.1", "node-b", "node-c"), l2("203.0.113.3", "node-c", "node-b")}},
	}
	held["node-b"].Announcements = append(held["node-b"].Announcements, l2("203.0.113.3", "node-a", "node-b"))
	plan := seedPlan(held)
	want := map[string][]string{
		"203.0.113.1": {"node-b", "node-c"},
		"203.0.113.2": {"node-b", "node-a"},
		"203.0.113.3": {"node-c", "node-b"},
		"203.0.113.9": {"node-a", "node-b"},
	}
	if len(plan) != len(want) {
		t.Fatalf("plan %v, want %v", plan, want)
	}
	for vip, nodes := range want {
		e := plan[netip.MustParseAddr(vip)]
		if !slices.Equal(e.Nodes, nodes) {
			t.Errorf("%s: %v, want %v", vip, e.Nodes, nodes)
		}
	}
	if plan[netip.MustParseAddr("203.0.113.9")].Mode != planner.BGP {
		t.Errorf("203.0.113.9 should be BGP")
	}
}

// fixedFence is a term that raising moves up.
type fixedFence struct{ term uint64 }

func (f *fixedFence) Term() uint64 { return f.term }
func (f *fixedFence) Raise(_ context.Context, above uint64) (uint64, error) {
	f.term = max(f.term, above+1)
	return f.term, nil
}

// harness runs an announcer on fake clients, one sync at a time, without agents: what it
// would push is in loop.pushes, what it would write is counted.
type harness struct {
	t       testing.TB
	ctx     context.Context
	client  *fake.Clientset
	factory informers.SharedInformerFactory
	objects *objects.Objects
	rec     *record.FakeRecorder
	a       *Announcer
	writes  int
}

func newHarness(t testing.TB, nodes int) *harness {
	t.Helper()
	h, reach := newUnplanned(t, nodes)
	h.sync(changes{nodes: true, reach: reach})
	return h
}

// newUnplanned is newHarness before its first plan: the nodes known, every one reachable (the
// returned map) but not yet told.
func newUnplanned(t testing.TB, nodes int) (*harness, map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{t: t, ctx: ctx, client: fake.NewClientset(), rec: record.NewFakeRecorder(1 << 20), objects: objects.NewObjects()}
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		v1alpha1.IPPoolResource: "IPPoolList", v1alpha1.BGPPeerResource: "BGPPeerList", v1alpha1.ServiceAnnouncementResource: "ServiceAnnouncementList",
	})
	h.factory = informers.NewSharedInformerFactory(h.client, 0)
	dynF := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	h.a = New(Config{Client: h.client, Dynamic: dyn, Recorder: h.rec, Objects: h.objects, MaxCandidates: 3, Serves: desired.DefaultServes})
	h.a.Register(h.factory, dynF)
	h.factory.Start(ctx.Done())
	dynF.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), h.a.synced...) {
		t.Fatal("caches")
	}
	h.a.fence = &fixedFence{1}
	h.a.agents = h.a.newAgents(1)
	reach := map[string]bool{}
	for i := range nodes {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node%d", i+1), Labels: map[string]string{"rack": fmt.Sprint(i % 2)}}}
		h.add(h.factory.Core().V1().Nodes().Informer(), n)
		reach[n.Name] = true
	}
	h.a.loop.refreshNodes(h.a)
	return h, reach
}

func (h *harness) add(inf cache.SharedIndexInformer, obj any) {
	h.t.Helper()
	if err := inf.GetIndexer().Add(obj); err != nil {
		h.t.Fatal(err)
	}
}

// sync runs one round and counts the writes it asks for.
func (h *harness) sync(ch changes) {
	if ch.services == nil {
		ch.services = map[string]bool{}
	}
	if ch.pools == nil {
		ch.pools = map[string]bool{}
	}
	if ch.reach == nil {
		ch.reach = map[string]bool{}
	}
	if ch.refused == nil {
		ch.refused = map[string]refusal{}
	}
	h.a.writer.TakePending() // what earlier rounds left is not this round's
	h.a.sync(h.ctx, ch)
	h.writes += h.a.writer.TakePending() // writes are not applied: the informers are fed by hand
	for len(h.rec.Events) > 0 {
		<-h.rec.Events
		h.writes++
	}
}

func (h *harness) pool(name string, spec map[string]any) {
	h.notePool(name, spec)
	h.sync(changes{pools: map[string]bool{name: true}})
}

// notePool adds a pool without a round.
func (h *harness) notePool(name string, spec map[string]any) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool",
		"metadata": map[string]any{"name": name, "generation": int64(1), "creationTimestamp": time.Unix(1e9, 0).UTC().Format(time.RFC3339)},
		"spec":     spec,
	}}
	h.objects.Note(u, false, objects.KindPool)
}

func (h *harness) service(name, pool string, local bool, ips ...string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{"metalvip.io/allocated-pool": pool}},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
	if local {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	h.add(h.factory.Core().V1().Services().Informer(), s)
	return s
}

func (h *harness) endpoints(svc string, nodes ...string) {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	for _, n := range nodes {
		ready := true
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"198.18.0.1"}, NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if err := h.factory.Discovery().V1().EndpointSlices().Informer().GetIndexer().Update(es); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) nodesOf(vip string) []string {
	e, _ := h.a.loop.planner.Entry(netip.MustParseAddr(vip))
	return e.Nodes
}

func (h *harness) pushedTo(node, vip string) bool {
	p := h.a.loop.parts[node]
	if p == nil {
		return false
	}
	for _, an := range (nodeState{head: &agentv1.DesiredState{}, anns: p.anns}).Build().GetAnnouncements() {
		if an.GetVip() == vip {
			return true
		}
	}
	return false
}

func TestAPoolWhoseSelectorDoesNotParseIsAnnouncedFromNoNode(t *testing.T) {
	h := newHarness(t, 3)
	h.pool("good", map[string]any{"addresses": []any{"203.0.113.0/28"}})
	h.pool("bad", map[string]any{"addresses": []any{"203.0.113.16/28"}, "announce": map[string]any{"mode": "L2",
		"nodeSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "rack", "operator": "In"}}}}})
	h.service("a", "good", false, "203.0.113.1")
	h.service("b", "bad", false, "203.0.113.17")
	h.sync(changes{services: map[string]bool{"ns/a": true, "ns/b": true}})
	if got := h.nodesOf("203.0.113.1"); len(got) != 3 {
		t.Errorf("the good pool's VIP has candidates %v", got)
	}
	if got := h.nodesOf("203.0.113.17"); len(got) != 0 {
		t.Errorf("the invalid pool's VIP is announced from %v; want no node", got)
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		if h.pushedTo(n, "203.0.113.17") {
			t.Errorf("%s is told to announce the invalid pool's VIP", n)
		}
	}
	elig := h.a.eligibility(h.a.loop.set.Pool("bad"))
	if elig.Status != metav1.ConditionFalse || !strings.Contains(elig.Message, "spec.announce.nodeSelector") {
		t.Errorf("NodesEligible of the invalid pool: %+v", elig)
	}
	c := desired.Condition(h.a.addresses("ns/b"), 0)
	if c.Reason != desired.ReasonNoEligibleNode {
		t.Errorf("Service condition %+v", c)
	}
}

func TestOneServiceChangeRebuildsOnlyItsNodes(t *testing.T) {
	h := newHarness(t, 6)
	h.pool("p", map[string]any{"addresses": []any{"203.0.113.0/24"}})
	keys := map[string]bool{}
	for i := range 30 {
		h.service(fmt.Sprintf("s%d", i), "p", false, fmt.Sprintf("203.0.113.%d", i+1))
		keys[fmt.Sprintf("ns/s%d", i)] = true
	}
	h.service("local", "p", true, "203.0.113.100")
	h.endpoints("local", "node1")
	keys["ns/local"] = true
	h.sync(changes{services: keys})
	before := map[string]pushed{}
	for n, st := range h.a.loop.pushes {
		before[n] = st
	}
	if got := h.nodesOf("203.0.113.100"); !slices.Equal(got, []string{"node1"}) {
		t.Fatalf("the Local VIP is on %v, want node1", got)
	}
	h.endpoints("local", "node4")
	h.sync(changes{services: map[string]bool{"ns/local": true}})
	if got := h.nodesOf("203.0.113.100"); !slices.Equal(got, []string{"node4"}) {
		t.Fatalf("the Local VIP is on %v after its endpoint moved, want node4", got)
	}
	for n, st := range h.a.loop.pushes {
		changed := st != before[n]
		if want := n == "node1" || n == "node4"; changed != want {
			t.Errorf("%s: state rebuilt %v, want %v", n, changed, want)
		}
	}
}

// BenchmarkOneServiceChange measures a round after one Service's endpoint moved, with n
// Services in the informers (3 nodes, so each node's state holds every VIP): the work per
// change is the planner's and one sorted insertion per node concerned, not a pass over every
// Service. writes/op counts the API writes the round asks for (conditions, Events).
func BenchmarkOneServiceChange(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			h := newHarness(b, 3)
			h.pool("p", map[string]any{"addresses": []any{"10.0.0.0/16"}})
			keys := map[string]bool{}
			for i := range n {
				ip := netip.AddrFrom4([4]byte{10, 0, byte((i + 1) >> 8), byte(i + 1)})
				h.service(fmt.Sprintf("s%d", i), "p", false, ip.String())
				keys[fmt.Sprintf("ns/s%d", i)] = true
			}
			h.service("local", "p", true, "10.0.255.1")
			keys["ns/local"] = true
			h.endpoints("local", "node1")
			h.sync(changes{services: keys})
			h.writes = 0
			b.ResetTimer()
			for i := range b.N {
				h.endpoints("local", []string{"node2", "node3"}[i%2])
				h.sync(changes{services: map[string]bool{"ns/local": true}})
			}
			b.ReportMetric(float64(h.writes)/float64(b.N), "writes/op")
		})
	}
}

// TestTheStatusOfGoneNodesAndPoolsIsForgotten: what the announcer last wrote of a node, a pool
// or a peer goes with it, so that its memory follows the cluster as it is (an autoscaled
// cluster's nodes come and go under new names).
func TestTheStatusOfGoneNodesAndPoolsIsForgotten(t *testing.T) {
	h := newHarness(t, 3)
	h.pool("p", map[string]any{"addresses": []any{"203.0.113.0/28"}})
	has := func(key string) bool { _, ok := h.a.loop.statusSet[key]; return ok }
	for _, k := range []string{"node/node3", "IPPool/p"} {
		if !has(k) {
			t.Fatalf("no status set for %s before: %v", k, h.a.loop.statusSet)
		}
	}
	node3, err := h.client.CoreV1().Nodes().Get(context.Background(), "node3", metav1.GetOptions{})
	if err != nil {
		node3 = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node3"}}
	}
	if err := h.factory.Core().V1().Nodes().Informer().GetIndexer().Delete(node3); err != nil {
		t.Fatal(err)
	}
	h.objects.Note(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "IPPool", "metadata": map[string]any{"name": "p"},
	}}, true, objects.KindPool)
	h.sync(changes{nodes: true, pools: map[string]bool{"p": true}})
	for _, k := range []string{"node/node3", "IPPool/p"} {
		if has(k) {
			t.Errorf("the status of %s is still kept after it was deleted: %v", k, h.a.loop.statusSet)
		}
	}
	if !has("node/node1") {
		t.Errorf("node1's status was dropped with node3's: %v", h.a.loop.statusSet)
	}
}
