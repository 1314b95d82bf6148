package provider

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// Issue 30, fault 9: the fence adopted the Lease's holder as itself, whoever it was. A
// process elected leader recognises itself by its hostname in the framework's identity
// (hostname_UUID); a holder of another host is never adopted (nor its term raised for).
func TestTheFenceAdoptsOnlyAHolderOfItsOwnHost(t *testing.T) {
	hostname = func() (string, error) { return "ccm-a", nil }
	t.Cleanup(func() { hostname = defaultHostname })
	le := LeaderElection{Enabled: true, Namespace: "kube-system", Name: "metalvip-cloud-controller-manager"}
	lease := func(holder string) *coordinationv1.Lease {
		n := int32(6)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseTransitions: &n}}
	}
	t.Run("a holder of this host is this process", func(t *testing.T) {
		f, err := newLeaseFence(t.Context(), fake.NewClientset(lease("ccm-a_0b6f")), le)
		if err != nil || f.Term() != 7 || f.holder != "ccm-a_0b6f" {
			t.Fatalf("fence %+v, %v; want term 7 held by ccm-a_0b6f", f, err)
		}
	})
	for _, holder := range []string{"ccm-b_0b6f", "ccm-ab_0b6f", "ccm-a"} {
		t.Run("a holder of another host is not adopted: "+holder, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
			defer cancel()
			if f, err := newLeaseFence(ctx, fake.NewClientset(lease(holder)), le); err == nil {
				t.Fatalf("fence adopted %q with term %d", holder, f.Term())
			}
		})
	}
}
