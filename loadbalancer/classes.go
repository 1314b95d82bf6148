package loadbalancer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/desired"
)

// ClassFinalizer keeps a Service of metalvip's class until its addresses are given back.
const ClassFinalizer = "metalvip.io/load-balancer-cleanup"

// ClassController serves the Services of metalvip's loadBalancerClass, which the framework's
// service controller skips (it serves class-less Services only): a finalizer, addresses from
// the same allocator, the status. Services of any other class are never touched.
type ClassController struct {
	client   kubernetes.Interface
	allocs   *Allocations
	recorder record.EventRecorder
	serves   desired.Serves

	services corelisters.ServiceLister
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
}

// NewClassController returns the controller; Register and Run make it work.
func NewClassController(client kubernetes.Interface, allocs *Allocations, recorder record.EventRecorder, serves desired.Serves) *ClassController {
	return &ClassController{
		client: client, allocs: allocs, recorder: recorder, serves: serves,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metalvip-class"}),
	}
}

// Register adds the Service informer's handlers (the caller starts the factory).
func (c *ClassController) Register(factory informers.SharedInformerFactory) {
	inf := factory.Core().V1().Services()
	c.services, c.synced = inf.Lister(), inf.Informer().HasSynced
	enqueue := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		s, ok := o.(*v1.Service)
		if !ok || !(c.serves.Classed(s) || slices.Contains(s.Finalizers, ClassFinalizer)) {
			return
		}
		c.queue.Add(desired.Key(s))
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	})
}

// Run works until ctx ends, with a few workers.
func (c *ClassController) Run(ctx context.Context, workers int) {
	go func() { <-ctx.Done(); c.queue.ShutDown() }()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return
	}
	klog.InfoS("Serving Services of a loadBalancerClass", "class", c.serves.Class)
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

func (c *ClassController) next(ctx context.Context) bool {
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
	default:
		klog.V(2).InfoS("Syncing a classed Service failed; retrying", "service", key, "err", err)
		c.queue.AddRateLimited(key)
	}
	return true
}

func (c *ClassController) sync(ctx context.Context, key string) error {
	ns, name, _ := cutKey(key)
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	has := slices.Contains(svc.Finalizers, ClassFinalizer)
	if svc.DeletionTimestamp != nil || !c.serves.Classed(svc) {
		if !has {
			return nil
		}
		if err := c.allocs.Delete(ctx, svc); err != nil {
			return err
		}
		if len(svc.Status.LoadBalancer.Ingress) > 0 {
			if err := c.patchStatus(ctx, svc, &v1.LoadBalancerStatus{}); err != nil {
				return err
			}
		}
		return c.patchFinalizers(ctx, svc, slices.DeleteFunc(slices.Clone(svc.Finalizers), func(f string) bool { return f == ClassFinalizer }))
	}
	if !has {
		// First the finalizer: an address is never given to a Service that could vanish
		// without giving it back.
		return c.patchFinalizers(ctx, svc, append(slices.Clone(svc.Finalizers), ClassFinalizer))
	}
	st, err := c.allocs.Ensure(ctx, svc)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(svc.Status.LoadBalancer.Ingress, st.Ingress) {
		return nil
	}
	return c.patchStatus(ctx, svc, st)
}

// patchFinalizers sets the finalizers, on the resourceVersion read, so no other finalizer is
// lost to a race.
func (c *ClassController) patchFinalizers(ctx context.Context, svc *v1.Service, fins []string) error {
	patch, err := jsonMerge(map[string]any{"metadata": map[string]any{"finalizers": fins, "resourceVersion": svc.ResourceVersion}})
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (c *ClassController) patchStatus(ctx context.Context, svc *v1.Service, st *v1.LoadBalancerStatus) error {
	patch, err := jsonMerge(map[string]any{"status": map[string]any{"loadBalancer": st}})
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("write the status of %s: %w", desired.Key(svc), err)
	}
	return nil
}

func cutKey(key string) (ns, name string, ok bool) { return strings.Cut(key, "/") }

func jsonMerge(v any) ([]byte, error) { return json.Marshal(v) }
