// Package loadbalancer decides, for Services of type LoadBalancer, which addresses they get
// (through the pure ipam package) and keeps that decision in step with the cluster: it rebuilds
// the allocator from every Service before answering anything, watches IP pools, reports on
// Services with Events and on pools with status. It knows nothing of the cloud-provider
// framework (provider/ adapts to it) and never touches the wire (nodeagent/ does).
package loadbalancer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"golang.org/x/time/rate"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

// recordRate bounds the deferred allocation records written a second; they are written only
// after recordLull without a new allocation.
const (
	recordRate = 50
	recordLull = time.Second
)

// Config configures Allocations.
type Config struct {
	Client   kubernetes.Interface
	Dynamic  dynamic.Interface
	Recorder record.EventRecorder
	// Objects are the decoded pools and peers, shared with the announcer.
	Objects *Objects
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
	later        workqueue.TypedRateLimitingInterface[string] // records to write off the hot path
	limiter      *rate.Limiter
	lastAlloc    atomic.Int64 // UnixNano of the last new allocation: deferred records wait for a lull

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
	return &Allocations{
		cfg:          cfg,
		ipam:         ipam.New(),
		warned:       map[types.UID]string{},
		annotated:    map[types.UID]string{},
		orphaned:     map[string]bool{},
		written:      map[string]poolStatus{},
		ready:        make(chan struct{}),
		poolsChanged: make(chan struct{}, 1),
		later: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metalvip-allocation-records"}),
		limiter: rate.NewLimiter(recordRate, recordRate),
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
	a.cfg.Objects.Subscribe(func(c Change) {
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
	close(a.ready)
	go a.recordLater(ctx)
	go func() { <-ctx.Done(); a.later.ShutDown() }()
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
		a.cfg.Recorder.Eventf(byKey[key], v1.EventTypeWarning, ReasonIPConflict, "%v; this Service gets a new address", err)
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
	}
	return s, errors.Join(errs...)
}

// statusIPs returns the addresses in a Service's status.
func statusIPs(svc *v1.Service) []netip.Addr { return desired.StatusIPs(svc) }

// Ensure gives a Service its addresses, or says why it cannot.
func (a *Allocations) Ensure(ctx context.Context, svc *v1.Service) (*v1.LoadBalancerStatus, error) {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	req, err := a.request(svc)
	if err != nil {
		a.warnOnce(svc, ReasonInvalidAnnotation, err.Error()+"; fix the annotation")
		return nil, err
	}
	a.annotationWarnings(svc)
	a.mu.Lock()
	prev, _ := a.ipam.Get(req.Key)
	al, err := a.ipam.Assign(req)
	if err == nil {
		a.dirty = true
	}
	a.mu.Unlock()
	if err != nil {
		reason, retry := classify(err)
		a.warnOnce(svc, reason, err.Error())
		if retry {
			return nil, &RetryError{Err: err, After: a.cfg.PendingRetry}
		}
		return nil, err
	}
	a.clearWarning(svc)
	if !slices.Equal(prev.IPs, al.IPs) {
		// Only new addresses count as a burst: the syncs that the deferred records cause
		// themselves must not hold the records back.
		a.lastAlloc.Store(time.Now().UnixNano())
	}
	if err := a.record(ctx, svc, al); err != nil {
		return nil, err
	}
	if !slices.Equal(prev.IPs, al.IPs) {
		a.cfg.Recorder.Eventf(svc, v1.EventTypeNormal, ReasonIPAllocated, "Allocated %s from IP pool %s", annotation.FormatIPs(al.IPs), al.Pool)
	}
	return status(al), nil
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
		return ReasonPoolExhausted, true
	case errors.Is(err, ipam.ErrInUse):
		return ReasonIPInUse, true
	case errors.Is(err, ipam.ErrSharing):
		return ReasonSharingConflict, true
	case errors.Is(err, ipam.ErrNoPool), errors.Is(err, ipam.ErrNotAdmitted), errors.Is(err, ipam.ErrPoolUnusable):
		return ReasonNoPool, true
	default:
		return ReasonInvalidRequest, false
	}
}

// record writes the allocation annotations when they differ.
//
// A Service that had addresses in its status and is given others (a move) gets them at once,
// before the status changes (the framework writes it after Ensure returns): after a restart, a
// difference between annotation and status shows the Service was being moved. A Service getting
// its first addresses has nothing to lose in a restart before its status is written, so its
// record is written later, off the allocation's path, at a bounded rate: every annotation write
// makes the framework sync the Service once more.
func (a *Allocations) record(ctx context.Context, svc *v1.Service, al ipam.Allocation) error {
	if recorded(svc, al) {
		return nil
	}
	if len(statusIPs(svc)) == 0 {
		a.later.Add(serviceKey(svc))
		return nil
	}
	return a.writeRecord(ctx, svc, al)
}

func recorded(svc *v1.Service, al ipam.Allocation) bool {
	pool, _ := annotation.AllocatedPool.Value(svc)
	ips, _ := annotation.AllocatedIPs.Value(svc)
	return pool == al.Pool && ips == annotation.FormatIPs(al.IPs)
}

// recordLater writes the deferred records, at most recordRate a second.
func (a *Allocations) recordLater(ctx context.Context) {
	for {
		key, quit := a.later.Get()
		if quit {
			return
		}
		func() {
			defer a.later.Done(key)
			// Wait for a lull in allocations: during a burst the API server has better things
			// to do than records (and the resyncs they cause).
			for time.Since(time.Unix(0, a.lastAlloc.Load())) < recordLull {
				select {
				case <-ctx.Done():
					return
				case <-time.After(recordLull / 4):
				}
			}
			if err := a.limiter.Wait(ctx); err != nil {
				return
			}
			ns, name, _ := strings.Cut(key, "/")
			svc, err := a.services.Services(ns).Get(name)
			if err != nil || !a.ours(svc) || svc.DeletionTimestamp != nil {
				return
			}
			a.mu.Lock()
			al, ok := a.ipam.Get(key)
			a.mu.Unlock()
			if !ok || recorded(svc, al) {
				return
			}
			if err := a.writeRecord(ctx, svc, al); err != nil {
				klog.V(2).InfoS("Recording an allocation failed; retrying", "service", key, "err", err)
				a.later.AddRateLimited(key)
				return
			}
			a.later.Forget(key)
		}()
	}
}

func (a *Allocations) writeRecord(ctx context.Context, svc *v1.Service, al ipam.Allocation) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q,%q:%q}}}`,
		annotation.AllocatedPool, al.Pool, annotation.AllocatedIPs, annotation.FormatIPs(al.IPs))
	if _, err := a.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("record allocation on %s: %w", serviceKey(svc), err)
	}
	return nil
}

// Delete gives up a Service's addresses. Those its status still shows stay reserved until the
// status is cleared, so they are never given to another Service while in use.
func (a *Allocations) Delete(ctx context.Context, svc *v1.Service) error {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.mu.Lock()
	a.ipam.Withdraw(serviceKey(svc), statusIPs(svc))
	a.dirty = true
	delete(a.warned, svc.UID)
	a.mu.Unlock()
	_, hasPool := annotation.AllocatedPool.Value(svc)
	_, hasIPs := annotation.AllocatedIPs.Value(svc)
	if svc.DeletionTimestamp == nil && (hasPool || hasIPs) {
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null,%q:null}}}`, annotation.AllocatedPool, annotation.AllocatedIPs)
		_, err := a.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove allocation record from %s: %w", serviceKey(svc), err)
		}
	}
	return nil
}

// Get returns a Service's status and whether anything is held for it.
func (a *Allocations) Get(svc *v1.Service) (*v1.LoadBalancerStatus, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := serviceKey(svc)
	al, ok := a.ipam.Get(key)
	_, recorded := annotation.AllocatedIPs.Value(svc)
	exists := ok || a.ipam.Known(key) || recorded || len(statusIPs(svc)) > 0
	if !ok {
		return &v1.LoadBalancerStatus{}, exists
	}
	return status(al), exists
}

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
			a.cfg.Recorder.Eventf(cur, v1.EventTypeWarning, ReasonIPConflict, "%v", err)
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
		a.cfg.Recorder.Event(svc, v1.EventTypeWarning, ReasonAnnotationIgnored, msg)
	}
}

// warnOnce emits a Warning Event unless the same one was the last given to the Service.
func (a *Allocations) warnOnce(svc *v1.Service, reason, msg string) {
	a.mu.Lock()
	last := a.warned[svc.UID]
	a.warned[svc.UID] = reason + "|" + msg
	a.mu.Unlock()
	if last != reason+"|"+msg {
		a.cfg.Recorder.Event(svc, v1.EventTypeWarning, reason, msg)
	}
}

func (a *Allocations) clearWarning(svc *v1.Service) {
	a.mu.Lock()
	delete(a.warned, svc.UID)
	a.mu.Unlock()
}
