package provider

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// term returns this leader's term: the acquire time of the leader Lease (a new leader acquires
// it only after the old one's lease ran out, so terms grow), or, without leader election, the
// process's start. Both are Unix microseconds, so switching between the two keeps terms
// growing, and a restart within the same second still gets a higher term.
func term(ctx context.Context, client kubernetes.Interface, started time.Time) uint64 {
	if started.IsZero() {
		started = time.Now()
	}
	if !LeaderElection.Enabled {
		return uint64(started.UnixMicro())
	}
	for {
		lease, err := client.CoordinationV1().Leases(LeaderElection.Namespace).Get(ctx, LeaderElection.Name, metav1.GetOptions{})
		if err == nil && lease.Spec.AcquireTime != nil {
			return uint64(lease.Spec.AcquireTime.UnixMicro())
		}
		klog.ErrorS(err, "Reading the leader Lease for the term; retrying", "lease", LeaderElection.Namespace+"/"+LeaderElection.Name)
		select {
		case <-ctx.Done():
			return uint64(started.UnixMicro())
		case <-time.After(time.Second):
		}
	}
}

// heartbeatKeys reads the failover key Secret, creating it with a random key when missing.
// Key "key" signs; "previous", if present, still verifies (rotate by moving key to previous and
// writing a new key).
func heartbeatKeys(ctx context.Context, client kubernetes.Interface, ref string) ([][]byte, error) {
	ns, name, _ := strings.Cut(ref, "/")
	secrets := client.CoreV1().Secrets(ns)
	for range 5 {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return nil, err
			}
			_, err = secrets.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/part-of": "metalvip"}},
				Data:       map[string][]byte{"key": key},
			}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create Secret %s: %w", ref, err)
			}
			continue // read it back: another replica may have won the race
		}
		if err != nil {
			return nil, fmt.Errorf("read Secret %s: %w", ref, err)
		}
		if len(s.Data["key"]) < 16 {
			return nil, fmt.Errorf("secret %s: key \"key\" must hold at least 16 bytes", ref)
		}
		keys := [][]byte{s.Data["key"]}
		if prev := s.Data["previous"]; len(prev) > 0 {
			keys = append(keys, prev)
		}
		return keys, nil
	}
	return nil, fmt.Errorf("secret %s: could not create or read it", ref)
}
