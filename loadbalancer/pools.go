package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

var everything = labels.Everything()

// poolFromAPI converts an IPPool. An error means the pool cannot be used (the CRD's rules
// should have refused it; this guards against objects written under an older schema).
func poolFromAPI(p *v1alpha1.IPPool) (ipam.Pool, error) {
	out := ipam.Pool{
		Name:          p.Name,
		AutoAssign:    p.Spec.AutoAssign == nil || *p.Spec.AutoAssign,
		AvoidBuggyIPs: p.Spec.AvoidBuggyIPs,
		Priority:      p.Spec.Priority,
		Order:         p.CreationTimestamp.UnixNano(),
	}
	var errs []error
	for _, s := range p.Spec.Addresses {
		r, err := ipam.ParseRange(string(s))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.Ranges = append(out.Ranges, r)
	}
	if len(p.Spec.Addresses) == 0 {
		errs = append(errs, errors.New("spec.addresses is empty"))
	}
	if sa := p.Spec.ServiceAllocation; sa != nil {
		out.Namespaces = sa.Namespaces
		var err error
		if sa.NamespaceSelector != nil {
			if out.NamespaceSelector, err = sa.NamespaceSelector.AsSelector(); err != nil {
				errs = append(errs, fmt.Errorf("serviceAllocation.namespaceSelector: %w", err))
			}
		}
		if sa.ServiceSelector != nil {
			if out.ServiceSelector, err = sa.ServiceSelector.AsSelector(); err != nil {
				errs = append(errs, fmt.Errorf("serviceAllocation.serviceSelector: %w", err))
			}
		}
	}
	return out, errors.Join(errs...)
}

// listPools returns the IPPools in the cache, typed.
func (a *Allocations) listPools() []*v1alpha1.IPPool {
	objs, err := a.pools.List(everything)
	if err != nil {
		klog.ErrorS(err, "List IPPools")
		return nil
	}
	out := make([]*v1alpha1.IPPool, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &v1alpha1.IPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			klog.ErrorS(err, "Decode IPPool", "pool", u.GetName())
			continue
		}
		out = append(out, p)
	}
	return out
}

func (a *Allocations) syncPools() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applyPoolsLocked()
}

// applyPoolsLocked gives the allocator the current pools and warns the Services whose
// addresses left their pool. The caller holds a.mu.
func (a *Allocations) applyPoolsLocked() {
	var pools []ipam.Pool
	for _, p := range a.listPools() {
		ip, err := poolFromAPI(p)
		if err != nil {
			klog.ErrorS(err, "IPPool not used", "pool", p.Name)
			continue
		}
		pools = append(pools, ip)
	}
	rep := a.ipam.SetPools(pools)
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
			if o.PoolDeleted {
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonPoolDeleted,
					"Address %s came from IP pool %s, which was deleted; the Service keeps it until it is deleted or asks for another address", o.IP, o.Pool)
			} else {
				a.cfg.Recorder.Eventf(svc, v1.EventTypeWarning, ReasonPoolShrunk,
					"Address %s is no longer in IP pool %s (removed from its spec.addresses); the Service keeps it until it is deleted or asks for another address", o.IP, o.Pool)
			}
		}
	}
	for id := range a.orphaned {
		if !seen[id] {
			delete(a.orphaned, id)
		}
	}
}

// writePoolStatus writes the status of every pool whose figures or conditions changed.
func (a *Allocations) writePoolStatus(ctx context.Context) {
	a.mu.Lock()
	if !a.dirty {
		a.mu.Unlock()
		return
	}
	a.dirty = false
	type update struct {
		pool   *v1alpha1.IPPool
		status v1alpha1.IPPoolStatus
	}
	var updates []update
	for _, p := range a.listPools() {
		st := p.Status.DeepCopy()
		st.ObservedGeneration = p.Generation
		if _, err := poolFromAPI(p); err != nil {
			setCondition(st, p, v1alpha1.PoolReady, metav1.ConditionFalse, "InvalidSpec", err.Error())
		} else if stats, ok := a.ipam.PoolStats(p.Name); ok {
			fillStatus(st, p, stats)
		}
		if !equality.Semantic.DeepEqual(*st, p.Status) {
			updates = append(updates, update{p, *st})
		}
	}
	a.mu.Unlock()

	for _, u := range updates {
		p := u.pool.DeepCopy()
		p.Status = u.status
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			klog.ErrorS(err, "Encode IPPool", "pool", p.Name)
			continue
		}
		_, err = a.cfg.Dynamic.Resource(v1alpha1.IPPoolResource).UpdateStatus(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
		if err != nil {
			// A conflict or a network error: the next round tries again.
			klog.V(2).InfoS("Write IPPool status", "pool", p.Name, "err", err)
			a.mu.Lock()
			a.dirty = true
			a.mu.Unlock()
		}
	}
}

func fillStatus(st *v1alpha1.IPPoolStatus, p *v1alpha1.IPPool, s ipam.Stats) {
	st.AllocatedIPv4, st.AllocatedIPv6 = s.Allocated[ipam.IPv4], s.Allocated[ipam.IPv6]
	st.AvailableIPv4, st.AvailableIPv6 = s.Available[ipam.IPv4], s.Available[ipam.IPv6]
	if s.Usable {
		setCondition(st, p, v1alpha1.PoolReady, metav1.ConditionTrue, "Allocating",
			fmt.Sprintf("Gives out addresses: %d IPv4 and %d IPv6 free", st.AvailableIPv4, st.AvailableIPv6))
	} else {
		setCondition(st, p, v1alpha1.PoolReady, metav1.ConditionFalse, "Overlaps",
			fmt.Sprintf("Shares addresses with the older pool %s and gives out none until the overlap is removed", s.ShadowedBy))
	}
	if len(s.Overlaps) > 0 {
		setCondition(st, p, v1alpha1.PoolOverlaps, metav1.ConditionTrue, "Overlaps",
			fmt.Sprintf("Shares addresses with %s; of overlapping pools only the oldest gives out addresses", strings.Join(s.Overlaps, ", ")))
	} else {
		setCondition(st, p, v1alpha1.PoolOverlaps, metav1.ConditionFalse, "NoOverlap", "Shares no address with another pool")
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
		setCondition(st, p, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionTrue, "InUse",
			fmt.Sprintf("%d addresses removed from spec.addresses are still held: %s; Services keep them until deleted or given others", len(s.Orphans), strings.Join(examples, ", ")))
	} else {
		setCondition(st, p, v1alpha1.PoolAddressesInUseRemoved, metav1.ConditionFalse, "None", "Every held address is in spec.addresses")
	}
}

func setCondition(st *v1alpha1.IPPoolStatus, p *v1alpha1.IPPool, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: p.Generation,
	})
}
