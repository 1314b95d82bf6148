package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// Finalizers that keep a Service until its addresses are given back: the framework's usual one
// for class-less Services (so Services it served before keep theirs), metalvip's own for
// Services of its class (another implementation's service controller would take the
// framework's one off a classed Service it is deleting).
const (
	Finalizer      = "service.kubernetes.io/load-balancer-cleanup"
	ClassFinalizer = "metalvip.io/load-balancer-cleanup"
)

// ServiceController serves every Service metalvip serves, in place of the framework's service
// controller: class-less ones (unless the cloud-config leaves them to another implementation)
// and those of metalvip's loadBalancerClass. A new Service costs one write to it: a status
// patch that carries the finalizer and the allocation record too, and then its IPAllocated
// Event, paced behind other allocations; the framework's costs a finalizer patch, the status,
// two Events and, for the record, a patch that makes it sync the Service again. Services of
// any other class are never touched.
type ServiceController struct {
	client kubernetes.Interface
	allocs *Allocations
	serves desired.Serves
	// pacer learns of every allocation written; reports (the IPAllocated Event here, the
	// Announced condition in the announcer) wait behind them.
	pacer   *report.Pacer
	reports *report.Writer
	// splitWrites is set once the API server is seen to drop metadata in a status write.
	splitWrites atomic.Bool

	services corelisters.ServiceLister
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
}

// NewServiceController returns the controller; Register and Run make it work.
func NewServiceController(client kubernetes.Interface, allocs *Allocations, serves desired.Serves) *ServiceController {
	pacer := report.NewPacer(report.ReportsQuiet, report.ReportsPerSecond)
	return &ServiceController{
		client: client, allocs: allocs, serves: serves, pacer: pacer,
		reports: report.NewWriter("metalvip-service-events", pacer),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metalvip-services"}),
	}
}

// report.Pacer is what reports wait behind while this controller writes allocations.
func (c *ServiceController) Pacer() *report.Pacer { return c.pacer }

// EventSource is the component metalvip's Events come from.
const EventSource = "metalvip-cloud-controller-manager"

// published reports that a Service's status now shows al: the IPAllocated Event, paced
// behind allocations. It is created here, not through the recorder: the recorder drops Events
// past 1,000 queued, which the Events of a burst let go at once would pass; here each is
// created in turn and retried until it is.
func (c *ServiceController) published(svc *v1.Service, al ipam.Allocation) {
	ref := v1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID}
	msg := fmt.Sprintf("Allocated %s from IP pool %s", annotation.FormatIPs(al.IPs), al.Pool)
	at := metav1.Now()
	name := fmt.Sprintf("%s.%x", svc.Name, at.UnixNano())
	c.reports.SetPaced("event/"+desired.Key(svc), func(ctx context.Context) error {
		ev := &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name},
			InvolvedObject: ref, Reason: report.ReasonIPAllocated, Message: msg, Type: v1.EventTypeNormal,
			Source: v1.EventSource{Component: EventSource}, ReportingController: EventSource,
			FirstTimestamp: at, LastTimestamp: at, Count: 1}
		_, err := c.client.CoreV1().Events(svc.Namespace).Create(ctx, ev, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
			return nil // made by an earlier try; or the namespace is gone
		}
		return err
	})
}

// Register adds the Service informer's handlers (the caller starts the factory).
func (c *ServiceController) Register(factory informers.SharedInformerFactory) {
	inf := factory.Core().V1().Services()
	c.services, c.synced = inf.Lister(), inf.Informer().HasSynced
	enqueue := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		s, ok := o.(*v1.Service)
		if !ok || !(c.serves.Ours(s) || c.hasFinalizer(s)) {
			return
		}
		c.queue.Add(desired.Key(s))
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(o, n any) {
			os, ok1 := o.(*v1.Service)
			ns, ok2 := n.(*v1.Service)
			if ok1 && ok2 && !needsSync(os, ns) {
				return // its own status or record written back, or a change nothing depends on
			}
			enqueue(n)
		},
		DeleteFunc: enqueue,
	})
}

// needsSync reports whether a Service's change can change what it is given. The record and
// finalizer this controller writes itself are not a change: the sync that wrote them goes on
// to the status, and a second one, racing it with a cache that lacks the status yet, would
// write it twice.
func needsSync(o, n *v1.Service) bool {
	return !equality.Semantic.DeepEqual(o.Spec, n.Spec) || !sameAnnotations(o.Annotations, n.Annotations) ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
		!equality.Semantic.DeepEqual(o.Status.LoadBalancer, n.Status.LoadBalancer) || !slices.Equal(othersFinalizers(o), othersFinalizers(n))
}

func sameAnnotations(a, b map[string]string) bool {
	for k, v := range a {
		if k != string(annotation.AllocatedPool) && k != string(annotation.AllocatedIPs) && b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if k != string(annotation.AllocatedPool) && k != string(annotation.AllocatedIPs) && a[k] != v {
			return false
		}
	}
	return true
}

func othersFinalizers(s *v1.Service) []string {
	return slices.DeleteFunc(slices.Clone(s.Finalizers), func(f string) bool { return f == Finalizer || f == ClassFinalizer })
}

func (c *ServiceController) hasFinalizer(s *v1.Service) bool {
	return slices.Contains(s.Finalizers, Finalizer) || slices.Contains(s.Finalizers, ClassFinalizer)
}

// Run works until ctx ends, with workers syncing Services at once.
func (c *ServiceController) Run(ctx context.Context, workers int) {
	go func() { <-ctx.Done(); c.queue.ShutDown() }()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return
	}
	klog.InfoS("Serving Services of type LoadBalancer", "classless", c.serves.Classless, "loadBalancerClass", c.serves.Class, "workers", workers)
	reports := make(chan struct{})
	// Four at a time: an Event is cheap, and after a burst of thousands they should not trail
	// the addresses by minutes.
	go func() { defer close(reports); c.reports.Run(ctx, 4) }()
	defer func() { <-reports }()
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for c.next(ctx) {
			}
		}()
	}
	for range workers {
		<-done
	}
}

func (c *ServiceController) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.sync(ctx, key)
	var retry *RetryError
	switch {
	case err == nil:
		c.queue.Forget(key)
	case errors.As(err, &retry):
		c.queue.Forget(key)
		c.queue.AddAfter(key, retry.After)
	case ctx.Err() != nil:
	default:
		klog.V(2).InfoS("Syncing a Service failed; retrying", "service", key, "err", err)
		c.queue.AddRateLimited(key)
	}
	return true
}

func (c *ServiceController) sync(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // the allocator frees what a deleted Service held
	}
	if err != nil {
		return err
	}
	if svc.DeletionTimestamp != nil || !c.serves.Ours(svc) {
		return c.cleanup(ctx, svc)
	}
	al, err := c.allocs.Assign(ctx, svc)
	if err != nil {
		return err
	}
	klog.V(2).InfoS("Service served", "service", key, "addresses", annotation.FormatIPs(al.IPs), "pool", al.Pool)
	fin := Finalizer
	if c.serves.Classed(svc) {
		fin = ClassFinalizer
	}
	st := StatusOf(al)
	needMeta := !slices.Contains(svc.Finalizers, fin) || !Recorded(svc, al)
	needStatus := !equality.Semantic.DeepEqual(svc.Status.LoadBalancer.Ingress, st.Ingress)
	if !needMeta && !needStatus {
		return nil
	}
	var meta map[string]any
	if needMeta {
		// The resourceVersion: a merge patch replaces the finalizer list whole, so it must not
		// drop one added meanwhile.
		meta = map[string]any{"resourceVersion": svc.ResourceVersion,
			"annotations": map[string]any{string(annotation.AllocatedPool): al.Pool, string(annotation.AllocatedIPs): annotation.FormatIPs(al.IPs)}}
		if !slices.Contains(svc.Finalizers, fin) {
			meta["finalizers"] = append(slices.Clone(svc.Finalizers), fin)
		}
	}
	// The record and the finalizer come with the status, or before it: after a restart a
	// record that differs from the status shows a Service being moved, and an address is never
	// shown for a Service that could vanish without giving it back. A Service's status
	// subresource takes metadata too (its strategy resets only the spec), so one write carries
	// all three at once: a round trip and a write less per Service than two patches, and the
	// API server's CPU is what a create burst waits for.
	if c.splitWrites.Load() {
		if meta != nil {
			if _, err := c.patch(ctx, svc, map[string]any{"metadata": meta}, ""); err != nil {
				return err
			}
		}
		if !needStatus {
			return nil
		}
		meta = nil
	}
	body := map[string]any{"status": map[string]any{"loadBalancer": st}}
	if meta != nil {
		body["metadata"] = meta
	}
	c.pacer.Allocating()
	got, err := c.patch(ctx, svc, body, "status")
	if err != nil || got == nil {
		return err
	}
	if needStatus {
		c.published(svc, al)
	}
	if meta == nil || (slices.Contains(got.Finalizers, fin) && Recorded(got, al)) {
		return nil
	}
	// An API server whose status subresource drops metadata: write it the long way at once,
	// and from now on before the status.
	klog.ErrorS(nil, "The API server ignored the finalizer and allocation record in a status write; writing them to the Service itself from now on", "service", key)
	c.splitWrites.Store(true)
	meta["resourceVersion"] = got.ResourceVersion
	_, err = c.patch(ctx, got, map[string]any{"metadata": meta}, "")
	return err
}

// cleanup gives a Service's addresses back when it is being deleted or no longer ours: the
// status emptied, then the record and the finalizers gone in one patch.
func (c *ServiceController) cleanup(ctx context.Context, svc *v1.Service) error {
	if !c.hasFinalizer(svc) {
		return nil
	}
	if err := c.allocs.Withdraw(ctx, svc); err != nil {
		return err
	}
	rv := svc.ResourceVersion
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		got, err := c.patch(ctx, svc, map[string]any{"status": map[string]any{"loadBalancer": v1.LoadBalancerStatus{}}}, "status")
		if err != nil || got == nil {
			return err
		}
		rv = got.ResourceVersion
	}
	keep := slices.DeleteFunc(slices.Clone(svc.Finalizers), func(f string) bool { return f == Finalizer || f == ClassFinalizer })
	meta := map[string]any{"resourceVersion": rv, "finalizers": keep}
	if svc.DeletionTimestamp == nil {
		meta["annotations"] = map[string]any{string(annotation.AllocatedPool): nil, string(annotation.AllocatedIPs): nil}
	}
	_, err := c.patch(ctx, svc, map[string]any{"metadata": meta}, "")
	return err
}

// patch writes a merge patch to the Service (or its status); a Service gone is no error.
func (c *ServiceController) patch(ctx context.Context, svc *v1.Service, body map[string]any, sub string) (*v1.Service, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	var subs []string
	what := "the record and finalizer"
	if sub != "" {
		subs, what = []string{sub}, "the status"
		if body["metadata"] != nil {
			what = "the status, record and finalizer"
		}
	}
	got, err := c.client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, b, metav1.PatchOptions{}, subs...)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("write %s of %s: %w", what, desired.Key(svc), err)
	}
	return got, nil
}
