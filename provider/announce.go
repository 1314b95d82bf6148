package provider

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// LeaderElection tells the provider how this process was elected, for the term it sends to
// agents. main sets it from the framework's flags before the controllers start.
var LeaderElection struct {
	Enabled         bool
	Namespace, Name string
}

// term returns this leader's term, a fencing token from the API server, never from a clock:
// the leader Lease's leaseTransitions plus one (it grows only when another holder takes the
// Lease, so a deposed leader's term is lower), or 1 without leader election (one CCM: nothing
// to fence; a restart resumes the agents' generations from what they report).
func term(ctx context.Context, client kubernetes.Interface) uint64 {
	if !LeaderElection.Enabled {
		return 1
	}
	for {
		lease, err := client.CoordinationV1().Leases(LeaderElection.Namespace).Get(ctx, LeaderElection.Name, metav1.GetOptions{})
		if err == nil {
			var transitions int32
			if lease.Spec.LeaseTransitions != nil {
				transitions = *lease.Spec.LeaseTransitions
			}
			return uint64(transitions) + 1
		}
		klog.ErrorS(err, "Reading the leader Lease for the term; retrying", "lease", LeaderElection.Namespace+"/"+LeaderElection.Name)
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(time.Second):
		}
	}
}
