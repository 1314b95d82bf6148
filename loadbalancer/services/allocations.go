// Package services decides, for Services of type LoadBalancer, which addresses they get
// (through the pure ipam package) and keeps that decision in step with the cluster: it rebuilds
// the allocator from every Service before answering anything, watches IP pools, reports on
// Services with Events and on pools with status. It knows nothing of the cloud-provider
// framework (provider/ adapts to it) and never touches the wire (nodeagent/ does).
package services

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// Config configures Allocations.
type Config struct {
	Client   kubernetes.Interface
	Dynamic  dynamic.Interface
	Recorder record.EventRecorder
	// objects.Objects are the decoded pools and peers, shared with the announcer.
	Objects *objects.Objects
	// Serves says which Services are metalvip's.
	Serves desired.Serves
	// PendingRetry is how often a Service waiting for an address is tried again (a pool may
	// have grown or an address been freed meanwhile).
	PendingRetry time.Duration
	// StatusInterval bounds how often IPPool status is written.
	StatusInterval time.Duration
}

// Allocations gives Services their addresses and keeps the record of it.
type Allocations struct {
	cfg Config

	mu    sync.Mutex // guards ipam, warned, orphaned, dirty
	ipam  *ipam.Allocator
	dirty bool // pool figures changed since the last status write
	// warned holds the last warning given per Service, so a retry does not repeat it.
	warned map[types.UID]string
	// annotated holds the last annotation warning given per Service.
	annotated map[types.UID]string
	// orphaned holds the orphan warnings given, per Service and address.
	orphaned map[string]bool
	// written is the status last applied per pool.
	written map[string]poolStatus

	ready        chan struct{} // closed once the allocator is rebuilt
	poolsChanged chan struct{}

	services   corelisters.ServiceLister
	namespaces corelisters.NamespaceLister

	synced []cache.InformerSynced
}

// New returns Allocations; Start makes it work.
func New(cfg Config) *Allocations {
	if cfg.PendingRetry <= 0 {
		cfg.PendingRetry = 10 * time.Second
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	registerPoolMetrics()
	return &Allocations{
		cfg:          cfg,
		ipam:         ipam.New(),
		warned:       map[types.UID]string{},
		annotated:    map[types.UID]string{},
		orphaned:     map[string]bool{},
		written:      map[string]poolStatus{},
		ready:        make(chan struct{}),
		poolsChanged: make(chan struct{}, 1),
	}
}

// Register registers the informers it needs with the factories (which the caller starts).
func (a *Allocations) Register(factory informers.SharedInformerFactory, dynFactory dynamicinformer.DynamicSharedInformerFactory) {
	svcInformer := factory.Core().V1().Services()
	nsInformer := factory.Core().V1().Namespaces()
	a.services = svcInformer.Lister()
	a.namespaces = nsInformer.Lister()
	_, _ = svcInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) { a.serviceUpdated(old, cur) },
		DeleteFunc: a.serviceDeleted,
	})

	a.cfg.Objects.Register(dynFactory)
	a.cfg.Objects.Subscribe(func(c objects.Change) {
		if c.Pool == "" {
			return
		}
		select {
		case a.poolsChanged <- struct{}{}:
		default:
		}
	})
	a.synced = []cache.InformerSynced{svcInformer.Informer().HasSynced, nsInformer.Informer().HasSynced, a.cfg.Objects.HasSynced}
}

// Run works until ctx ends: it waits for the caches, rebuilds the allocator from every Service,
// and then follows pool changes and writes pool status.
func (a *Allocations) Run(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return
	}
	a.rebuild()
	// Served before Ready says so: whoever waits for Ready (the announcer, a test) then finds
	// the pool metrics this allocator's (a CI run scraped between the two and found none).
	defer servePoolMetrics(a)()
	close(a.ready)
	klog.InfoS("Address allocator rebuilt from Services", "services", a.ipam.Len())

	tick := time.NewTicker(a.cfg.StatusInterval)
	defer tick.Stop()
	a.writePoolStatus(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.poolsChanged:
			a.syncPools()
		case <-tick.C:
			a.writePoolStatus(ctx)
		}
	}
}

// Ready is closed once the allocator has been rebuilt from the cluster.
func (a *Allocations) Ready() <-chan struct{} { return a.ready }

// PoolOf is the allocator's answer to which pool an address was given from
// (ipam.Allocator.PoolOf): the announcer's, never the Service's annotation.
func (a *Allocations) PoolOf(addr netip.Addr) (pool string, held bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ipam.PoolOf(addr)
}

// ours reports whether metalvip serves a Service.
func (a *Allocations) ours(svc *v1.Service) bool { return a.cfg.Serves.Ours(svc) }

func serviceKey(svc *v1.Service) string { return desired.Key(svc) }

// RetryError is an allocation that waiting may fix (a pool grows, an address is freed): the
// caller tries again after After. It unwraps to ErrRetry and to the cause.
type RetryError struct {
	Err   error
	After time.Duration
}

// ErrRetry is what every RetryError is.
var ErrRetry = errors.New("retry later")

func (e *RetryError) Error() string { return e.Err.Error() }

// Unwrap returns the cause and ErrRetry.
func (e *RetryError) Unwrap() []error { return []error{e.Err, ErrRetry} }

// rebuild restores every Service's recorded addresses, before anything is assigned.
func (a *Allocations) rebuild() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applyPoolsLocked()
	svcs, err := a.services.List(labels.Everything())
	if err != nil {
		klog.ErrorS(err, "List Services for the rebuild")
	}
	slices.SortFunc(svcs, func(x, y *v1.Service) int {
		if c := x.CreationTimestamp.Compare(y.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(serviceKey(x), serviceKey(y))
	})
	var recs []ipam.Record
	byKey := map[string]*v1.Service{}
	for _, svc := range svcs {
		published := statusIPs(svc)
		if !a.ours(svc) || len(published) == 0 {
			continue
		}
		req, _ := a.request(svc) // a bad annotation must not lose the address: restore regardless
		pool, _ := annotation.AllocatedPool.Value(svc)
		moving := false
		if v, ok := annotation.AllocatedIPs.Value(svc); ok {
			moving = v != annotation.FormatIPs(published)
		}
		recs = append(recs, ipam.Record{Service: req, Allocation: ipam.Allocation{Pool: pool, IPs: published}, Moving: moving})
		byKey[req.Key] = svc
	}
	for key, err := range a.ipam.Rebuild(recs) {
		klog.ErrorS(err, "Address in a Service's status is contested; the Service gets a new address", "service", key)
		a.cfg.Recorder.Eventf(byKey[key], v1.EventTypeWarning, report.ReasonIPConflict, "%s; this Service gets a new address", toldTo(byKey[key], err))
	}
	a.dirty = true
}

// request turns a Service into what the allocator needs.
func (a *Allocations) request(svc *v1.Service) (ipam.Service, error) {
	s := ipam.Service{
		Key:          serviceKey(svc),
		Namespace:    svc.Namespace,
		Labels:       svc.Labels,
		LocalTraffic: svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal,
		Published:    statusIPs(svc),
	}
	if s.LocalTraffic {
		s.Selector = labels.Set(svc.Spec.Selector).String() // sorted by key: one form
	}
	if ns, err := a.namespaces.Get(svc.Namespace); err == nil {
		s.NamespaceLabels = ns.Labels
	}
	for _, f := range svc.Spec.IPFamilies {
		if f == v1.IPv6Protocol {
			s.Families = append(s.Families, ipam.IPv6)
		} else {
			s.Families = append(s.Families, ipam.IPv4)
		}
	}
	if p := svc.Spec.IPFamilyPolicy; p != nil {
		switch *p {
		case v1.IPFamilyPolicyPreferDualStack:
			s.Policy = ipam.PreferDualStack
		case v1.IPFamilyPolicyRequireDualStack:
			s.Policy = ipam.RequireDualStack
		}
	}
	for _, p := range svc.Spec.Ports {
		s.Ports = append(s.Ports, ipam.Port{Protocol: string(p.Protocol), Port: p.Port})
	}
	var errs []error
	var err error
	if s.Pool, err = annotation.PoolFromService(svc); err != nil {
		errs = append(errs, err)
	}
	if s.IPs, err = annotation.IPsFromService(svc); err != nil {
		errs = append(errs, err)
	}
	if s.SharingKey, err = annotation.SharingKeyFromService(svc); err != nil {
		errs = append(errs, err)
	}
	if s.Count, err = annotation.VIPCountFromService(svc); err != nil {
		errs = append(errs, err)
	} else if fams := max(len(s.Families), 1); s.Count*fams > annotation.MaxVIPCount {
		// One Service, one services.loadbalancers quota unit: at most MaxVIPCount addresses in
		// all, whatever its families (issue 30, fault 8: 16 per family gave 32).
		v, _ := annotation.VIPCount.Value(svc)
		errs = append(errs, fmt.Errorf("annotation %s=%q with %d IP families gives %d addresses; a Service has at most %d in all: give %d or fewer", annotation.VIPCount, v, fams, s.Count*fams, annotation.MaxVIPCount, annotation.MaxVIPCount/fams))
	}
	return s, errors.Join(errs...)
}

// statusIPs returns the addresses in a Service's status.
func statusIPs(svc *v1.Service) []netip.Addr { return desired.StatusIPs(svc) }

// Assign gives a Service its addresses, or says why it cannot; it writes nothing but Warning
// Events (the Service controller writes the record and the status, and the IPAllocated Event
// once the status shows them).
func (a *Allocations) Assign(ctx context.Context, svc *v1.Service) (ipam.Allocation, error) {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return ipam.Allocation{}, ctx.Err()
	}
	req, err := a.request(svc)
	if err != nil {
		a.pending(ctx, svc, report.ReasonInvalidAnnotation, err.Error()+"; fix the annotation")
		return ipam.Allocation{}, err
	}
	a.annotationWarnings(svc)
	a.mu.Lock()
	al, err := a.ipam.Assign(req)
	if err == nil {
		a.dirty = true
	}
	a.mu.Unlock()
	if err != nil {
		reason, retry := classify(err)
		klog.V(2).InfoS("Service's addresses not allocated", "service", req.Key, "reason", reason, "err", err)
		told := toldTo(svc, err)
		if why := a.reservedAsked(req.IPs); why != "" {
			reason, told = report.ReasonAddressReserved, why
		}
		a.pending(ctx, svc, reason, told)
		if retry {
			return ipam.Allocation{}, &RetryError{Err: err, After: a.cfg.PendingRetry}
		}
		return ipam.Allocation{}, err
	}
	a.allocated(ctx, svc)
	return al, nil
}

// reservedAsked says why the first of the requested addresses that the cluster reserves
// (pools.Reservation) may not be given; "" when none is.
func (a *Allocations) reservedAsked(ips []netip.Addr) string {
	for _, ip := range ips {
		for _, p := range a.cfg.Objects.Set().Pools() {
			if why := reservedIn(p, ip); why != "" {
				return fmt.Sprintf("requested address %s is %s, reserved: no Service may have it; request another address", ip, why)
			}
		}
	}
	return ""
}

func status(al ipam.Allocation) *v1.LoadBalancerStatus {
	st := &v1.LoadBalancerStatus{}
	vip := v1.LoadBalancerIPModeVIP
	for _, ip := range al.IPs {
		st.Ingress = append(st.Ingress, v1.LoadBalancerIngress{IP: ip.String(), IPMode: &vip})
	}
	return st
}

// classify maps an allocation failure to an Event reason, and whether waiting can fix it
// (pools change, addresses are freed) or only the Service's owner can.
func classify(err error) (reason string, retry bool) {
	switch {
	case errors.Is(err, ipam.ErrExhausted):
		return report.ReasonPoolExhausted, true
	case errors.Is(err, ipam.ErrInUse):
		return report.ReasonIPInUse, true
	case errors.Is(err, ipam.ErrSharing):
		return report.ReasonSharingConflict, true
	case errors.Is(err, ipam.ErrNoPool), errors.Is(err, ipam.ErrNotAdmitted), errors.Is(err, ipam.ErrPoolUnusable):
		return report.ReasonNoPool, true
	default:
		return report.ReasonInvalidRequest, false
	}
}

// toldTo is what a Service's owner is told of an allocation failure, in its Events: no Service
// of another namespace is named (ipam.Error.For). The CCM's log has the whole error.
func toldTo(svc *v1.Service, err error) string {
	var e *ipam.Error
	if errors.As(err, &e) {
		return e.For(svc.Namespace)
	}
	return err.Error()
}

// Recorded reports whether a Service's allocation record (its annotations) says al.
func Recorded(svc *v1.Service, al ipam.Allocation) bool {
	pool, _ := annotation.AllocatedPool.Value(svc)
	ips, _ := annotation.AllocatedIPs.Value(svc)
	return pool == al.Pool && ips == annotation.FormatIPs(al.IPs)
}

// Withdraw gives up a Service's addresses; it writes nothing (the Service controller removes
// the record with the finalizer). Those its status still shows stay reserved until the status
// is cleared, so they are never given to another Service while in use.
func (a *Allocations) Withdraw(ctx context.Context, svc *v1.Service) error {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.mu.Lock()
	a.ipam.Withdraw(serviceKey(svc), statusIPs(svc))
	a.dirty = true
	a.mu.Unlock()
	a.allocated(ctx, svc)
	return nil
}

// StatusOf is the load balancer status that shows an allocation.
func StatusOf(al ipam.Allocation) *v1.LoadBalancerStatus { return status(al) }

func (a *Allocations) serviceUpdated(oldObj, curObj any) {
	old, ok1 := oldObj.(*v1.Service)
	cur, ok2 := curObj.(*v1.Service)
	if !ok1 || !ok2 {
		return
	}
	select {
	case <-a.ready:
	default:
		return // the rebuild reads everything
	}
	published := statusIPs(cur)
	if slices.Equal(statusIPs(old), published) {
		return
	}
	key := serviceKey(cur)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ipam.Known(key) {
		a.ipam.Published(key, published)
		a.dirty = true
		return
	}
	// A status this controller does not know of: written by a previous leader just before it
	// stopped. Hold its addresses so they are not given twice.
	if a.ours(cur) && len(published) > 0 {
		req, _ := a.request(cur)
		pool, _ := annotation.AllocatedPool.Value(cur)
		if err := a.ipam.Restore(req, ipam.Allocation{Pool: pool, IPs: published}); err != nil {
			klog.ErrorS(err, "Status shows an address held by another Service", "service", key)
			a.cfg.Recorder.Eventf(cur, v1.EventTypeWarning, report.ReasonIPConflict, "%s", toldTo(cur, err))
		}
		a.dirty = true
	}
}

func (a *Allocations) serviceDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	svc, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ipam.Release(serviceKey(svc))
	delete(a.warned, svc.UID)
	delete(a.annotated, svc.UID)
	for k := range a.orphaned {
		if strings.HasPrefix(k, serviceKey(svc)+"|") {
			delete(a.orphaned, k)
		}
	}
	a.dirty = true
}

// annotationWarnings tells, once per distinct text, what of a Service's annotations is not
// honoured (MetalLB's overruled by metalvip's, rewritten, or unknown).
func (a *Allocations) annotationWarnings(svc *v1.Service) {
	w := annotation.Warnings(svc)
	if len(w) == 0 {
		return
	}
	msg := strings.Join(w, "; ")
	a.mu.Lock()
	last := a.annotated[svc.UID]
	a.annotated[svc.UID] = msg
	a.mu.Unlock()
	if last != msg {
		a.cfg.Recorder.Event(svc, v1.EventTypeWarning, report.ReasonAnnotationIgnored, msg)
	}
}
