package services

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/loadbalancer/report"
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
			case reservedIn(set.Pool(o.Pool), o.IP) != "":
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonAddressReserved,
					"Address %s is %s: no pool gives it and no node announces it for a Service; the Service keeps it until deleted or given another address", o.IP, reservedIn(set.Pool(o.Pool), o.IP))
			case o.PoolDeleted && set.Pool(o.Pool) != nil:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonPoolInvalid,
					"Address %s came from IP pool %s, which is invalid now (%s); the Service keeps the address, which no node announces until the pool is fixed", o.IP, o.Pool, pools.Problems(set.Pool(o.Pool).Problems))
			case o.PoolDeleted:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonPoolDeleted,
					"Address %s came from IP pool %s, which was deleted, and no other pool holds it; the Service keeps it, which no node announces, until it is deleted or asks for another address (or a pool holds it again)", o.IP, o.Pool)
			default:
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, report.ReasonPoolShrunk,
					"Address %s is no longer in IP pool %s (removed from its spec.addresses), and no other pool holds it; the Service keeps it, which no node announces, until it is deleted or asks for another address (or a pool holds it again)", o.IP, o.Pool)
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
		cur := a.cfg.Objects.Conditions(objects.KindPool, p.Name)
		st := poolStatus{ObservedGeneration: p.Generation}
		conds := report.KeepTransitions(cur)
		if !p.Valid() {
			report.SetCondition(&conds, p.Generation, v1alpha1.PoolReady, metav1.ConditionFalse, "InvalidSpec",
				pools.Problems(p.Problems)+"; the pool gives no addresses and is announced from no node until fixed")
		} else if stats, ok := a.ipam.PoolStats(p.Name); ok {
			fillStatus(&st, &conds, p.Generation, stats)
			if len(p.Reserved) > 0 {
				var held []string
				for _, r := range p.Reserved {
					held = append(held, fmt.Sprintf("%s, %s", r.Addr, r.Why))
				}
				msg := fmt.Sprintf("Holds %s: left out, never given to a Service nor announced", strings.Join(held, "; "))
				if len(stats.Overlaps) > 0 {
					msg += fmt.Sprintf("; shares addresses with %s, of overlapping pools only the oldest gives out addresses", strings.Join(stats.Overlaps, ", "))
				}
				report.SetCondition(&conds, p.Generation, v1alpha1.PoolOverlaps, metav1.ConditionTrue, "Reserved", msg)
			}
		}
		st.Conditions = report.Owned(conds, allocatorConditions)
		if last, ok := a.written[p.Name]; ok && equality.Semantic.DeepEqual(last, st) {
			continue
		}
		updates = append(updates, update{p.Name, st})
	}
	a.mu.Unlock()

	for _, u := range updates {
		if err := report.ApplyStatus(ctx, a.cfg.Dynamic, v1alpha1.IPPoolResource, "IPPool", u.name, &u.status, report.ManagerAllocator); err != nil {
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

func fillStatus(st *poolStatus, conds *[]metav1.Condition, gen int64, s ipam.Stats) {
	st.AllocatedIPv4, st.AllocatedIPv6 = s.Allocated[ipam.IPv4], s.Allocated[ipam.IPv6]
	st.AvailableIPv4, st.AvailableIPv6 = s.Available[ipam.IPv4], s.Available[ipam.IPv6]
	if s.Usable {
		report.SetCondition(conds, gen, v1alpha1.PoolReady, metav1.ConditionTrue, "Allocating",
			fmt.Sprintf("Gives out addresses: %d IPv4 and %d IPv6 free", st.AvailableIPv4, st.AvailableIPv6))
	} else {
		report.SetCondition(conds, gen, v1alpha1.PoolReady, metav1.ConditionFalse, "Overlaps",
			fmt.Sprintf("Shares addresses with the older pool %s and gives out none until the overlap is removed", s.ShadowedBy))
	}
	if len(s.Overlaps) > 0 {
		report.SetCondition(conds, gen, v1alpha1.PoolOverlaps, metav1.ConditionTrue, "Overlaps",
			fmt.Sprintf("Shares addresses with %s; of overlapping pools only the oldest gives out addresses", strings.Join(s.Overlaps, ", ")))
	} else {
		report.SetCondition(conds, gen, v1alpha1.PoolOverlaps, metav1.ConditionFalse, "NoOverlap", "Shares no address with another pool")
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
		report.SetCondition(conds, gen, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionTrue, "InUse",
			fmt.Sprintf("%d addresses removed from spec.addresses are still held and in no other pool: %s; Services keep them, announced from no node, until deleted or given others", len(s.Orphans), strings.Join(examples, ", ")))
	} else {
		report.SetCondition(conds, gen, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionFalse, "None", "Every held address given from this pool is in spec.addresses or another pool's")
	}
}

// reservedIn says what uses addr when the pool leaves it out as reserved; "" otherwise.
func reservedIn(p *pools.Pool, addr netip.Addr) string {
	if p == nil {
		return ""
	}
	for _, r := range p.Reserved {
		if r.Addr == addr.Unmap() {
			return r.Why
		}
	}
	return ""
}
