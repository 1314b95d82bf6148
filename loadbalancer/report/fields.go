package report

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metalvip/metalvip/api/v1alpha1"
)

// Field managers of metalvip's status writes: each owns only the fields it applies, so the
// allocator's pool figures and the announcer's conditions never overwrite each other.
const (
	ManagerAllocator = "metalvip-allocator"
	ManagerAnnouncer = "metalvip-announcer"
)

// KeepTransitions copies conditions, so that SetCondition keeps the transition time of those
// whose status does not change.
func KeepTransitions(cur []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, len(cur))
	copy(out, cur)
	return out
}

// Owned returns the conditions of the given types.
func Owned(conds []metav1.Condition, types []string) []metav1.Condition {
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

// ApplyStatus writes an object's status by server-side apply, as manager: it owns exactly
// the fields given.
func ApplyStatus(ctx context.Context, dyn dynamic.Interface, res schema.GroupVersionResource, kind, name string, status any, manager string) error {
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

// Apply writes obj (an apply configuration or a typed object, marshalled to JSON) at the API
// path by server-side apply, as manager, and reads nothing back. The clients' Apply methods
// decode the object the API server returns, which a report never uses: for the Announced
// condition and the ServiceAnnouncement of 10,000 Services that decoding was about 10 % of the
// CCM's allocations while they got their addresses (make bench, allocation of 10,000
// Services), and what a process allocates under load sets its peak memory. rc may be any REST
// client of the API server (the path is absolute).
func Apply(ctx context.Context, rc rest.Interface, obj any, manager string, path ...string) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	// Stream, not Do: Do reads the whole answer into memory to decode it; the body of one that
	// succeeded is only drained here (an error is decoded all the same).
	answer, err := rc.Patch(types.ApplyPatchType).AbsPath(path...).
		Param("fieldManager", manager).Param("force", "true").Body(body).Stream(ctx)
	if err != nil {
		return err
	}
	defer answer.Close()
	_, err = io.Copy(io.Discard, answer)
	return err
}

// ServiceStatusPath is the API path of a Service's status, for Apply.
func ServiceStatusPath(ns, name string) []string {
	return []string{"/api/v1/namespaces", ns, "services", name, "status"}
}

func SetCondition(conds *[]metav1.Condition, gen int64, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}

// ConditionAgentReachable is the Node condition that says whether the CCM reaches the node's
// agent.
const ConditionAgentReachable = "metalvip.io/AgentReachable"

// ManagerExternalIPs owns a Service's ExternalIPsAnnounced condition (apart from the
// announcer's Announced condition: one apply each).
const ManagerExternalIPs = "metalvip-external-ips"

// ManagerEgress owns a Service's Egress condition.
const ManagerEgress = "metalvip-egress"

// ServiceCondition is the status, to apply on a Service that shows cur (nil: none), that sets
// c: its transition time kept while its status stays. shown reports that cur says c already
// (written before, by this process or an earlier one): nothing to write.
func ServiceCondition(cur *metav1.Condition, c metav1.Condition) (st *corev1ac.ServiceStatusApplyConfiguration, shown bool) {
	if cur != nil && cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message && cur.ObservedGeneration == c.ObservedGeneration {
		return nil, true
	}
	ltt := metav1.NewTime(time.Now())
	if cur != nil && cur.Status == c.Status {
		ltt = cur.LastTransitionTime
	}
	return corev1ac.ServiceStatus().WithConditions(metav1ac.Condition().WithType(c.Type).WithStatus(c.Status).WithReason(c.Reason).
		WithMessage(c.Message).WithObservedGeneration(c.ObservedGeneration).WithLastTransitionTime(ltt)), false
}
