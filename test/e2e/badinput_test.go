package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/harness/proc"
)

// TestBadObjectsDisturbNothing creates, while a client probes an L2 VIP every 20 ms, every
// object the API server once accepted that froze the data plane: a community above 16 bits, BGP
// peers at addresses no router has or duplicated, keepalives not below the hold time, a pool of
// the whole address space with avoidBuggyIPs. Each is refused by the API server or isolated
// with a condition naming it; no probe is lost; the CCM stays small; and Services created
// afterwards, L2 and BGP, are answered and routed.
func TestBadObjectsDisturbNothing(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	steady := c.Service("steady")
	harness.Eventually(t, 30*time.Second, "the steady VIP is answered", func() bool { return c.Owner(steady) != "" })
	probe, err := c.Lab.Client.Probe(steady, 20*time.Millisecond, 6000)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Stop()
	harness.Eventually(t, 5*time.Second, "the probe is answered", probe.Answered)
	start := time.Now()

	type object struct {
		kind, name, spec string
		// isolated checks the condition an accepted object must carry.
		condType, condReason string
	}
	ns := c.NS
	objects := []object{
		{"IPPool", "community-" + ns, fmt.Sprintf(`{addresses: ["203.0.113.96/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {communities: ["65536:1"]}}}`, ns), "Ready", "InvalidSpec"},
		{"IPPool", "localpref-" + ns, fmt.Sprintf(`{addresses: ["203.0.113.112/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {mode: BGP, bgp: {localPref: 1099511627776}}}`, ns), "Ready", "InvalidSpec"},
		{"IPPool", "selector-" + ns, fmt.Sprintf(`{addresses: ["203.0.113.128/28"], autoAssign: false, serviceAllocation: {namespaces: [%s]}, announce: {nodeSelector: {matchExpressions: [{key: rack, operator: In}]}}}`, ns), "Ready", "InvalidSpec"},
		{"IPPool", "everything-" + ns, `{addresses: ["0.0.0.0/0"], autoAssign: false, avoidBuggyIPs: true}`, "Ready", "Overlaps"},
		{"IPPool", "everything6-" + ns, `{addresses: ["::/0"], autoAssign: false, avoidBuggyIPs: true}`, "", ""},
		{"BGPPeer", "unspecified-" + ns, `{address: 0.0.0.0, peerASN: 64496, myASN: 64497}`, "Accepted", "InvalidSpec"},
		{"BGPPeer", "linklocal-" + ns, `{address: "fe80::1", peerASN: 64496, myASN: 64497}`, "Accepted", "InvalidSpec"},
		{"BGPPeer", "multicast-" + ns, `{address: 224.0.0.5, peerASN: 64496, myASN: 64497}`, "Accepted", "InvalidSpec"},
		{"BGPPeer", "keepalive-" + ns, `{address: 198.51.100.77, peerASN: 64496, myASN: 64497, keepaliveSeconds: 90}`, "Accepted", "InvalidSpec"},
		{"BGPPeer", "hold-" + ns, `{address: 198.51.100.78, peerASN: 64496, myASN: 64497, holdTimeSeconds: 30, keepaliveSeconds: 30}`, "Accepted", "InvalidSpec"},
		{"BGPPeer", "duplicate-" + ns, `{address: 198.51.100.1, peerASN: 64511, myASN: 64497}`, "Accepted", "DuplicateAddress"},
	}
	// creationTimestamp counts whole seconds, and of two objects created in one second the
	// first by name counts as the older (pools.Set): "duplicate-" would take the address from
	// "router-", "everything-" the addresses of "l2-". The cluster's own pool and peer must be
	// older than these by the clock (a CI run created them in one second and failed).
	var newest time.Time
	for _, o := range []struct {
		gvr  schema.GroupVersionResource
		name string
	}{{v1alpha1.IPPoolResource, "l2-" + ns}, {v1alpha1.BGPPeerResource, "router-" + ns}} {
		u, err := c.Dyn.Resource(o.gvr).Get(ctx, o.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ts := u.GetCreationTimestamp().Time; ts.After(newest) {
			newest = ts
		}
	}
	time.Sleep(time.Until(newest.Add(time.Second + 100*time.Millisecond)))
	var report []string
	for _, o := range objects {
		var spec map[string]any
		if err := yaml.Unmarshal([]byte(o.spec), &spec); err != nil {
			t.Fatal(err)
		}
		gvr := v1alpha1.IPPoolResource
		if o.kind == "BGPPeer" {
			gvr = v1alpha1.BGPPeerResource
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": o.kind, "metadata": map[string]any{"name": o.name}, "spec": spec}}
		_, err := c.Dyn.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			report = append(report, fmt.Sprintf("%s %s: refused by the API server: %v", o.kind, o.name, err))
			continue
		}
		name := o.name
		t.Cleanup(func() { _ = c.Dyn.Resource(gvr).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		if o.condType == "" {
			report = append(report, fmt.Sprintf("%s %s: accepted and harmless", o.kind, o.name))
			continue
		}
		var msg string
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s %s is isolated with %s=False (%s)", o.kind, o.name, o.condType, o.condReason), func() bool {
			u, err := c.Dyn.Resource(gvr).Get(ctx, o.name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, x := range conds {
				m := x.(map[string]any)
				if m["type"] == o.condType && m["status"] == "False" && m["reason"] == o.condReason {
					msg, _ = m["message"].(string)
					return true
				}
			}
			return false
		})
		report = append(report, fmt.Sprintf("%s %s: accepted, isolated: %s=False %s: %s", o.kind, o.name, o.condType, o.condReason, msg))
	}

	// The data plane follows later changes: an L2 Service is answered, a BGP one routed from
	// every node.
	after := c.Service("after")
	harness.Eventually(t, 30*time.Second, "a Service created afterwards is answered", func() bool { return c.Owner(after) != "" })
	bgp := c.Service("after-bgp", cluster.InPool("bgp-"+ns))
	harness.Eventually(t, 60*time.Second, "a BGP Service created afterwards is routed from every node", func() bool {
		return slices.Equal(c.NextHops(bgp), []string{"198.51.100.11", "198.51.100.12", "198.51.100.13"})
	})
	probe.Stop()
	longest, lost := probe.Outage(start)
	rss := rssKiB(t, c.CCM.Cmd.Process.Pid)
	t.Logf("bad objects:\n  %s", strings.Join(report, "\n  "))
	t.Logf("steady VIP %s: %d probes lost, longest gap %s; after: %s answered by %s, %s routed by %v; CCM resident %d MiB",
		steady, lost, longest.Round(time.Millisecond), after, c.Owner(after), bgp, c.NextHops(bgp), rss>>10)
	if lost != 0 {
		t.Errorf("%d probes of the steady VIP lost while bad objects were created", lost)
	}
	if rss > 512<<10 {
		t.Errorf("the CCM holds %d MiB, over the Deployment's 512 MiB limit", rss>>10)
	}
}

// rssKiB is a process's peak resident memory (VmHWM), in KiB.
func rssKiB(t *testing.T, pid int) int64 {
	m, err := proc.MemoryOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	return m.HWM >> 10
}
