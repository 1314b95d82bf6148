package loadbalancer

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/pools"
)

// Field managers of metalvip's status writes: each owns only the fields it applies, so the
// allocator's pool figures and the announcer's conditions never overwrite each other.
const (
	managerAllocator = "metalvip-allocator"
	managerAnnouncer = "metalvip-announcer"
)

func (a *Allocations) syncPools() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applyPoolsLocked()
}

// applyPoolsLocked gives the allocator the current valid pools and warns the Services whose
// addresses left their pool. The caller holds a.mu.
func (a *Allocations) applyPoolsLocked() {
	set := a.cfg.Objects.Set()
	for _, p := range set.Pools() {
		if !p.Valid() {
			klog.ErrorS(nil, "IPPool not used: it gives no addresses and is announced from no node", "pool", p.Name, "problems", pools.Problems(p.Problems))
		}
	}
	rep := a.ipam.SetPools(set.AllocatorPools())
	a.dirty = true

	seen := map[string]bool{}
	for _, o := range rep.Orphans {
		for _, key := range o.Services {
			id := fmt.Sprintf("%s|%s|%s|%v", key, o.IP, o.Pool, o.PoolDeleted)
			seen[id] = true
			if a.orphaned[id] {
				continue
			}
			a.orphaned[id] = true
			ns, name, _ := strings.Cut(key, "/")
			svc, err := a.services.Services(ns).Get(name)
			if err != nil {
				continue
			}
			switch {
			case o.PoolDeleted && set.Pool(o.Pool) != nil:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonPoolInvalid,
					"Address %s came from IP pool %s, which is invalid now (%s); the Service keeps the address, which no node announces until the pool is fixed", o.IP, o.Pool, pools.Problems(set.Pool(o.Pool).Problems))
			case o.PoolDeleted:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonPoolDeleted,
					"Address %s came from IP pool %s, which was deleted; the Service keeps it, which no node announces, until it is deleted or asks for another address (or a pool named %s holds it again)", o.IP, o.Pool, o.Pool)
			default:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonPoolShrunk,
					"Address %s is no longer in IP pool %s (removed from its spec.addresses); the Service keeps it, which no node announces, until it is deleted or asks for another address (or the pool holds it again)", o.IP, o.Pool)
			}
		}
	}
	for id := range a.orphaned {
		if !seen[id] {
			delete(a.orphaned, id)
		}
	}
}

// poolStatus is the part of an IPPool's status the allocator owns.
type poolStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	AllocatedIPv4      int64              `json:"allocatedIPv4"`
	AllocatedIPv6      int64              `json:"allocatedIPv6"`
	AvailableIPv4      int64              `json:"availableIPv4"`
	AvailableIPv6      int64              `json:"availableIPv6"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// writePoolStatus applies the status of every pool whose figures or conditions changed.
func (a *Allocations) writePoolStatus(ctx context.Context) {
	a.mu.Lock()
	if !a.dirty {
		a.mu.Unlock()
		return
	}
	a.dirty = false
	type update struct {
		name   string
		status poolStatus
	}
	var updates []update
	for _, p := range a.cfg.Objects.Set().Pools() {
		cur := a.cfg.Objects.Conditions(kindPool, p.Name)
		st := poolStatus{ObservedGeneration: p.Generation}
		conds := keepTransitions(cur)
		if !p.Valid() {
			setCondition(&conds, p.Generation, v1alpha1.PoolReady, metav1.ConditionFalse, "InvalidSpec",
				pools.Problems(p.Problems)+"; the pool gives no addresses and is announced from no node until fixed")
		} else if stats, ok := a.ipam.PoolStats(p.Name); ok {
			fillStatus(&st, &conds, p.Generation, stats)
		}
		st.Conditions = owned(conds, allocatorConditions)
		if last, ok := a.written[p.Name]; ok && equality.Semantic.DeepEqual(last, st) {
			continue
		}
		updates = append(updates, update{p.Name, st})
	}
	a.mu.Unlock()

	for _, u := range updates {
		if err := applyStatus(ctx, a.cfg.Dynamic, v1alpha1.IPPoolResource, "IPPool", u.name, &u.status, managerAllocator); err != nil {
			// A conflict or a network error: the next round tries again.
			klog.V(2).InfoS("Write IPPool status", "pool", u.name, "err", err)
			a.mu.Lock()
			a.dirty = true
			a.mu.Unlock()
			continue
		}
		a.mu.Lock()
		a.written[u.name] = u.status
		a.mu.Unlock()
	}
}

// allocatorConditions are the pool condition types the allocator owns.
var allocatorConditions = []string{v1alpha1.PoolReady, v1alpha1.PoolOverlaps, v1alpha1.PoolAddressesInUseRemoved}

// keepTransitions copies conditions, so that setCondition keeps the transition time of those
// whose status does not change.
func keepTransitions(cur []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, len(cur))
	copy(out, cur)
	return out
}

// owned returns the conditions of the given types.
func owned(conds []metav1.Condition, types []string) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range conds {
		for _, t := range types {
			if c.Type == t {
				out = append(out, c)
			}
		}
	}
	return out
}

// applyStatus writes an object's status by server-side apply, as manager: it owns exactly
// the fields given.
func applyStatus(ctx context.Context, dyn dynamic.Interface, res schema.GroupVersionResource, kind, name string, status any, manager string) error {
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       kind,
		"metadata":   map[string]any{"name": name},
		"status":     st,
	}}
	_, err = dyn.Resource(res).ApplyStatus(ctx, name, obj, metav1.ApplyOptions{FieldManager: manager, Force: true})
	return err
}

func fillStatus(st *poolStatus, conds *[]metav1.Condition, gen int64, s ipam.Stats) {
	st.AllocatedIPv4, st.AllocatedIPv6 = s.Allocated[ipam.IPv4], s.Allocated[ipam.IPv6]
	st.AvailableIPv4, st.AvailableIPv6 = s.Available[ipam.IPv4], s.Available[ipam.IPv6]
	if s.Usable {
		setCondition(conds, gen, v1alpha1.PoolReady, metav1.ConditionTrue, "Allocating",
			fmt.Sprintf("Gives out addresses: %d IPv4 and %d IPv6 free", st.AvailableIPv4, st.AvailableIPv6))
	} else {
		setCondition(conds, gen, v1alpha1.PoolReady, metav1.ConditionFalse, "Overlaps",
			fmt.Sprintf("Shares addresses with the older pool %s and gives out none until the overlap is removed", s.ShadowedBy))
	}
	if len(s.Overlaps) > 0 {
		setCondition(conds, gen, v1alpha1.PoolOverlaps, metav1.ConditionTrue, "Overlaps",
			fmt.Sprintf("Shares addresses with %s; of overlapping pools only the oldest gives out addresses", strings.Join(s.Overlaps, ", ")))
	} else {
		setCondition(conds, gen, v1alpha1.PoolOverlaps, metav1.ConditionFalse, "NoOverlap", "Shares no address with another pool")
	}
	if len(s.Orphans) > 0 {
		var examples []string
		for i, o := range s.Orphans {
			if i == 5 {
				examples = append(examples, "...")
				break
			}
			examples = append(examples, fmt.Sprintf("%s (%s)", o.IP, strings.Join(o.Services, ", ")))
		}
		setCondition(conds, gen, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionTrue, "InUse",
			fmt.Sprintf("%d addresses removed from spec.addresses are still held: %s; Services keep them until deleted or given others", len(s.Orphans), strings.Join(examples, ", ")))
	} else {
		setCondition(conds, gen, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionFalse, "None", "Every held address is in spec.addresses")
	}
}

func setCondition(conds *[]metav1.Condition, gen int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}
