package provider

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// LeaderElection is how this process was elected, from the framework's flags.
type LeaderElection struct {
	Enabled         bool
	Namespace, Name string
}

// hostname is os.Hostname; tests replace it.
var hostname = defaultHostname

var defaultHostname = os.Hostname

// MaxTerm is the highest term: a Lease counts its transitions in an int32.
const MaxTerm = math.MaxInt32 + 1

// leaseFence gives this leader's term from the leader election Lease: its leaseTransitions
// plus one. Only the Lease makes it grow (each new holder adds one), so no clock, skewed or
// not, and no replayed claim can lock out the real leader: when an agent holds a term above
// this leader's (claimed by someone holding the CCM key, or left by an older version), Raise
// sets leaseTransitions above it, with the Lease's resourceVersion as precondition and only
// while the Lease still names the holder this process was elected as. Without leader
// election the same Lease counts the starts of the one CCM.
type leaseFence struct {
	client kubernetes.Interface
	le     LeaderElection
	mu     sync.Mutex
	term   uint64
	holder string
}

var _ interface {
	Term() uint64
	Raise(context.Context, uint64) (uint64, error)
} = (*leaseFence)(nil)

// newLeaseFence reads (without leader election: counts) the term, retrying until the Lease
// can be read or ctx ends.
func newLeaseFence(ctx context.Context, client kubernetes.Interface, le LeaderElection) (*leaseFence, error) {
	f := &leaseFence{client: client, le: le}
	backoff := 200 * time.Millisecond
	for {
		err := f.start(ctx)
		if err == nil {
			klog.InfoS("Term from the leader Lease", "term", f.term, "lease", le.Namespace+"/"+le.Name, "holder", f.holder)
			return f, nil
		}
		klog.ErrorS(err, "Reading the leader Lease for the term; retrying", "lease", le.Namespace+"/"+le.Name)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (f *leaseFence) leases() interface {
	Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
} {
	return f.client.CoordinationV1().Leases(f.le.Namespace)
}

func (f *leaseFence) start(ctx context.Context) error {
	lease, err := f.leases().Get(ctx, f.le.Name, metav1.GetOptions{})
	if f.le.Enabled {
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return errors.New("the Lease names no holder yet")
		}
		// This process holds the Lease under an identity the framework made and does not
		// tell: its hostname, "_", a UUID. A holder of another host is another process (this
		// one lost the Lease, and the framework ends it): its term is not this one's to adopt,
		// nor its name to raise the term for (issue 30, fault 9).
		host, err := hostname()
		if err != nil {
			return fmt.Errorf("this process's hostname, to recognise itself in the Lease: %w", err)
		}
		if holder := *lease.Spec.HolderIdentity; !strings.HasPrefix(holder, host+"_") {
			return fmt.Errorf("the Lease names %q, not a process of this host %q: not adopting its term", holder, host)
		}
		f.term, f.holder = transitions(lease)+1, *lease.Spec.HolderIdentity
		return nil
	}
	// No leader election: this start is a transition of its own.
	if apierrors.IsNotFound(err) {
		zero := int32(0)
		lease, err = f.leases().Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.le.Namespace, Name: f.le.Name, Labels: map[string]string{"app.kubernetes.io/part-of": "metalvip"}},
			Spec:       coordinationv1.LeaseSpec{LeaseTransitions: &zero},
		}, metav1.CreateOptions{})
		if err == nil {
			f.term = 1
			return nil
		}
	}
	if err != nil {
		return err
	}
	next := int32(min(transitions(lease)+1, math.MaxInt32))
	lease.Spec.LeaseTransitions = &next
	if _, err := f.leases().Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return err
	}
	f.term = uint64(next) + 1
	return nil
}

func transitions(l *coordinationv1.Lease) uint64 {
	if l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 0 {
		return 0
	}
	return uint64(*l.Spec.LeaseTransitions)
}

// Term is the current term.
func (f *leaseFence) Term() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term
}

// Raise makes the term greater than above by raising the Lease's leaseTransitions, if the
// Lease still names this leader; a term that cannot be reached by a Lease (above MaxTerm) is
// refused: an agent holding one must be reset by hand (docs/operations.md).
func (f *leaseFence) Raise(ctx context.Context, above uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if above < f.term {
		return f.term, nil
	}
	if above >= MaxTerm {
		return f.term, fmt.Errorf("term %d is beyond what a Lease can count (%d); it did not come from a Lease", above, MaxTerm)
	}
	for range 5 {
		lease, err := f.leases().Get(ctx, f.le.Name, metav1.GetOptions{})
		if err != nil {
			return f.term, err
		}
		if f.le.Enabled && (lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != f.holder) {
			return f.term, fmt.Errorf("the Lease names %v, not this leader %q: not raising the term", ptrString(lease.Spec.HolderIdentity), f.holder)
		}
		want := int32(above) // term = transitions+1 > above
		if transitions(lease) >= uint64(want) {
			f.term = transitions(lease) + 1
			return f.term, nil
		}
		lease.Spec.LeaseTransitions = &want
		if _, err := f.leases().Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				continue // the leader's own renewal: read again
			}
			return f.term, err
		}
		f.term = uint64(want) + 1
		return f.term, nil
	}
	return f.term, errors.New("the Lease kept changing")
}

func ptrString(s *string) string {
	if s == nil {
		return "no holder"
	}
	return *s
}
