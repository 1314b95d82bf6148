package services

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/report"
)

// pending tells a Service's owner why it has no address, once per distinct reason and
// message: a Warning Event, and the Service's Allocated condition (False), which stays while
// it waits (Events expire after an hour) and is what metalvipctl reads.
func (a *Allocations) pending(ctx context.Context, svc *v1.Service, reason, msg string) {
	a.mu.Lock()
	last := a.warned[svc.UID]
	a.warned[svc.UID] = reason + "|" + msg
	a.mu.Unlock()
	if last == reason+"|"+msg {
		return
	}
	a.cfg.Recorder.Event(svc, v1.EventTypeWarning, reason, msg)
	cur := meta.FindStatusCondition(svc.Status.Conditions, desired.ConditionAllocated)
	st, shown := report.ServiceCondition(cur, metav1.Condition{Type: desired.ConditionAllocated, Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: svc.Generation})
	if shown {
		return // written before (by this or an earlier leader)
	}
	ac := corev1ac.Service(svc.Name, svc.Namespace).WithStatus(st)
	if _, err := a.cfg.Client.CoreV1().Services(svc.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: report.ManagerAllocator, Force: true}); err != nil {
		klog.ErrorS(err, "Cannot write the Service's Allocated condition; tried again with the next attempt", "service", serviceKey(svc))
		a.mu.Lock()
		delete(a.warned, svc.UID)
		a.mu.Unlock()
	}
}

// allocated forgets a Service's warning and removes its Allocated condition when it shows
// one: a Service that never waited costs no write.
func (a *Allocations) allocated(ctx context.Context, svc *v1.Service) {
	a.mu.Lock()
	delete(a.warned, svc.UID)
	a.mu.Unlock()
	if meta.FindStatusCondition(svc.Status.Conditions, desired.ConditionAllocated) == nil {
		return
	}
	// Applying no condition as the allocator drops the one it owns.
	ac := corev1ac.Service(svc.Name, svc.Namespace).WithStatus(corev1ac.ServiceStatus())
	if _, err := a.cfg.Client.CoreV1().Services(svc.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: report.ManagerAllocator, Force: true}); err != nil {
		klog.ErrorS(err, "Cannot remove the Service's Allocated condition", "service", serviceKey(svc))
	}
}
