package objects

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// Objects holds the cluster's IPPools and BGPPeers, each decoded and validated once per spec
// change (package pools), for the allocator and the announcer alike: the two cannot disagree
// on what a pool is. Its methods are safe for concurrent use.
type Objects struct {
	mu     sync.Mutex
	pools  map[string]*pools.Pool
	peers  map[string]*pools.Peer
	status map[string][]metav1.Condition // kind/name -> conditions as last read
	set    *pools.Set                    // nil after a change until Set rebuilds it
	// reserved are addresses the cluster uses otherwise (the control-plane VIP), cut out of
	// every pool (pools.WithReserved), with what uses each.
	reserved map[netip.Addr]string
	subs     []func(Change)

	register sync.Once
	synced   []cache.InformerSynced
}

// Change names what changed: a pool or a peer (by name).
type Change struct {
	Pool, Peer string
}

// NewObjects returns an empty set of objects; Register fills it from informers.
func NewObjects() *Objects {
	return &Objects{pools: map[string]*pools.Pool{}, peers: map[string]*pools.Peer{}, status: map[string][]metav1.Condition{}}
}

// Register adds the IPPool and BGPPeer informers to the factory (which the caller starts).
// Calling it again does nothing.
func (o *Objects) Register(dyn dynamicinformer.DynamicSharedInformerFactory) {
	o.register.Do(func() {
		pi := dyn.ForResource(v1alpha1.IPPoolResource).Informer()
		bi := dyn.ForResource(v1alpha1.BGPPeerResource).Informer()
		_, _ = pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { o.Note(obj, false, KindPool) },
			UpdateFunc: func(_, obj any) { o.Note(obj, false, KindPool) },
			DeleteFunc: func(obj any) { o.Note(obj, true, KindPool) },
		})
		_, _ = bi.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { o.Note(obj, false, KindPeer) },
			UpdateFunc: func(_, obj any) { o.Note(obj, false, KindPeer) },
			DeleteFunc: func(obj any) { o.Note(obj, true, KindPeer) },
		})
		o.synced = []cache.InformerSynced{pi.HasSynced, bi.HasSynced}
	})
}

// HasSynced reports whether both informers have listed everything.
func (o *Objects) HasSynced() bool {
	for _, s := range o.synced {
		if !s() {
			return false
		}
	}
	return len(o.synced) > 0
}

// Subscribe calls f after every change of a spec, outside the lock.
func (o *Objects) Subscribe(f func(Change)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.subs = append(o.subs, f)
}

const (
	KindPool = "IPPool"
	KindPeer = "BGPPeer"
)

// Note takes in an object the informers saw (or lost, deleted): what their handlers call, and
// how a test feeds objects by hand. kind is KindPool or KindPeer.
func (o *Objects) Note(obj any, deleted bool, kind string) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	name := u.GetName()
	var conds []metav1.Condition
	if raw, ok, _ := unstructured.NestedSlice(u.Object, "status", "conditions"); ok {
		var st struct {
			Conditions []metav1.Condition `json:"conditions"`
		}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(map[string]any{"conditions": raw}, &st) == nil {
			conds = st.Conditions
		}
	}
	o.mu.Lock()
	key := kind + "/" + name
	if deleted {
		delete(o.status, key)
	} else {
		o.status[key] = conds
	}
	var old, cur int64 = -1, u.GetGeneration()
	switch kind {
	case KindPool:
		if p := o.pools[name]; p != nil {
			old = p.Generation
		}
		if deleted {
			delete(o.pools, name)
		} else if old != cur || cur == 0 {
			o.pools[name] = pools.DecodePool(u)
		}
	case KindPeer:
		if p := o.peers[name]; p != nil {
			old = p.Generation
		}
		if deleted {
			delete(o.peers, name)
		} else if old != cur || cur == 0 {
			o.peers[name] = pools.DecodePeer(u)
		}
	}
	if !deleted && old == cur && cur != 0 {
		o.mu.Unlock() // a status write: the spec is the same, nothing to tell
		return
	}
	o.set = nil
	subs := o.subs
	o.mu.Unlock()
	ch := Change{Pool: name}
	if kind == KindPeer {
		ch = Change{Peer: name}
	}
	for _, f := range subs {
		f(ch)
	}
}

// Reserve sets the addresses no pool may give out or announce (each with what uses it), in
// place of those set before; every pool counts as changed when they differ.
func (o *Objects) Reserve(reserved map[netip.Addr]string) {
	o.mu.Lock()
	if maps.Equal(o.reserved, reserved) {
		o.mu.Unlock()
		return
	}
	o.reserved = maps.Clone(reserved)
	o.set = nil
	subs := o.subs
	names := slices.Sorted(maps.Keys(o.pools))
	o.mu.Unlock()
	for _, name := range names {
		for _, f := range subs {
			f(Change{Pool: name})
		}
	}
}

// Conditions returns an object's conditions as last read: kind is "IPPool" or "BGPPeer".
func (o *Objects) Conditions(kind, name string) []metav1.Condition {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.status[kind+"/"+name]
}

// Set returns the current pools and peers as one consistent, immutable view.
func (o *Objects) Set() *pools.Set {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.set == nil {
		ps := make([]*pools.Pool, 0, len(o.pools))
		for _, p := range o.pools {
			ps = append(ps, p)
		}
		peers := make([]*pools.Peer, 0, len(o.peers))
		for _, p := range o.peers {
			peers = append(peers, p)
		}
		o.set = pools.NewSet(pools.WithReserved(ps, o.reserved), peers)
	}
	return o.set
}
