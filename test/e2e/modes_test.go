package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
)

// TestLoadBalancerOnlyMode: on a cluster whose kubelets are unchanged (nodes without the
// uninitialized taint and without providerIDs), the CCM with nodes.initialize: false and every
// default controller on gives addresses, the agents announce them, and no Node is touched.
func TestLoadBalancerOnlyMode(t *testing.T) {
	c := cluster.New(t, kubeapi.Get(t), cluster.Options{CCMBinary: ccmBinary, AgentBinary: agentBinary,
		CloudConfig: "nodes:\n  initialize: false\n", Controllers: "*"})
	ctx := context.Background()
	vip := c.Service("lb-only")
	harness.Eventually(t, 30*time.Second, "the address is answered by a node", func() bool { return c.Owner(vip) != "" })
	if err := c.Lab.Client.Ping(ctx, vip, 1); err != nil {
		t.Errorf("the client cannot reach %s: %v", vip, err)
	}
	if !strings.Contains(c.CCM.Output(), "failed to start cloud node controller") {
		t.Errorf("the cloud-node controller was not left off; CCM log:\n%s", c.CCM.Output())
	}
	nodes, err := c.Srv.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Spec.ProviderID != "" {
			t.Errorf("node %s was given the providerID %q", n.Name, n.Spec.ProviderID)
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == cloudproviderapi.TaintExternalCloudProvider {
				t.Errorf("node %s carries the uninitialized taint", n.Name)
			}
		}
		for _, k := range []string{"topology.kubernetes.io/zone", "node.kubernetes.io/instance-type"} {
			if _, ok := n.Labels[k]; ok {
				t.Errorf("node %s got the label %s", n.Name, k)
			}
		}
	}
	t.Logf("LoadBalancer-only: %s answered by %s; nodes untouched", vip, c.Owner(vip))
}
