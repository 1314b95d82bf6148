// Package plannedrestart tells a planned restart of an agent's Pod from the kubelet stopping
// it on its own. Both send the agent SIGTERM; only the first should make its peers and the CCM
// hold its VIPs for it (agent --restart-grace): a DaemonSet's rolling update, `kubectl rollout
// restart` or `kubectl delete pod` delete the Pod through the API, and a new one follows on the
// same node. A node shutting down (the kubelet's graceful node shutdown), a failed liveness
// probe or a container runtime stopping it leave the Pod undeleted: the node may not come
// back soon, and its VIPs should move now.
package plannedrestart

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Timeout bounds the one request Planned makes: a SIGTERM has little time, and an API server
// that does not answer says nothing of a restart.
const Timeout = 2 * time.Second

// Planned reports whether the Pod namespace/name is being deleted through the API (a planned
// restart) and why it decided so. Anything else, an error reading it included, is not one.
func Planned(ctx context.Context, c kubernetes.Interface, namespace, name string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err != nil:
		return false, fmt.Sprintf("its Pod %s/%s could not be read (%v): the VIPs move now", namespace, name, err)
	case pod.DeletionTimestamp == nil:
		return false, fmt.Sprintf("its Pod %s/%s is not being deleted (the kubelet stops it: a node shutting down, a failed probe): the VIPs move now", namespace, name)
	}
	return true, fmt.Sprintf("its Pod %s/%s is being deleted (a rolling update, a rollout restart, a deleted Pod): a new one follows", namespace, name)
}
