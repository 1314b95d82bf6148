package e2ecluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/kubecluster"
)

// egressPort is where the server behind the router records its connections' sources.
const egressPort = 9000

// egressCloudConfig is the cloud-config the egress test adds: the pod and ClusterIP ranges
// and the nodes' segment (not the router's far side, where the server is).
const egressCloudConfig = "    egress:\n      clusterCIDRs: [198.18.0.0/15, 198.51.100.0/25]\n"

// egressYAML: a pool that allows egress, announced from the workload nodes (node2, node3);
// one that does not; a client Deployment whose pods open a connection to the server every
// 20 ms, behind a Service that asks for egress; another client, behind a Service that does
// not; and a Service asking for egress in the pool that denies it.
var egressYAML = `apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-egress}
spec:
  addresses: ["203.0.113.96/29"]
  autoAssign: false
  egress: Allow
  announce: {mode: L2, nodeSelector: {matchLabels: {` + kubecluster.WorkloadLabel + `: "true"}}}
---
apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-no-egress}
spec: {addresses: ["203.0.113.104/29"], autoAssign: false}
---
apiVersion: v1
kind: Namespace
metadata: {name: egress}
` + clientDeployment("leaver") + clientDeployment("stayer") + `---
apiVersion: v1
kind: Service
metadata: {name: leaver, namespace: egress, annotations: {metalvip.io/pool: kc-egress, metalvip.io/egress: "true"}}
spec: {type: LoadBalancer, selector: {app: leaver}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: stayer, namespace: egress}
spec: {selector: {app: stayer}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: denied, namespace: egress, annotations: {metalvip.io/pool: kc-no-egress, metalvip.io/egress: "true"}}
spec: {type: LoadBalancer, selector: {app: leaver}, ports: [{port: 80, targetPort: 8080}]}
`

// clientDeployment is a Deployment of two pods, one on each workload node, each opening a
// connection to the server behind the router every 20 ms.
func clientDeployment(name string) string {
	return `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ` + name + `, namespace: egress}
spec:
  replicas: 2
  selector: {matchLabels: {app: ` + name + `}}
  template:
    metadata: {labels: {app: ` + name + `}}
    spec:
      terminationGracePeriodSeconds: 1
      automountServiceAccountToken: false
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: ` + kubecluster.WorkloadLabel + `, operator: In, values: ["true"]}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: ` + name + `}}}
      containers:
      - name: client
        image: example.test/httpd:v1
        imagePullPolicy: Never
        args: ["-dial", "198.51.100.130:` + fmt.Sprint(egressPort) + `", "-every", "20ms"]
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        securityContext: {runAsNonRoot: true, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
`
}

// TestEgressOnRealKubelets is issue 33's acceptance: pods of a Service that asks for egress
// reach a server behind the router from the Service's address, on the egress node and on the
// other node, while another Service's pods keep their node's address; the egress node killed
// hard, new connections leave from the address again through the next candidate; the
// annotation removed, every rule and route the agents added is gone.
func TestEgressOnRealKubelets(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	// The shipped heartbeat profile (the failover measured is the product's), and egress's
	// cluster ranges in the cloud-config.
	saved := c.Failover
	c.Failover, c.CloudConfig = nil, egressCloudConfig
	empty, yes := "", "true"
	if err := c.Label(ctx, "node1", kubecluster.ControlPlaneLabel, &empty); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.Dir, "egress.yaml")
	t.Cleanup(func() {
		c.Failover, c.CloudConfig = saved, ""
		if t.Failed() {
			c.LogFailure(ctx, t)
			out, _ := c.Kubectl(ctx, "-n", "egress", "logs", "-l", "app in (leaver,stayer)", "--tail", "20", "--prefix")
			t.Logf("client logs:\n%s", out)
		}
		if _, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait", "--timeout", "2m", "-f", file); err != nil {
			t.Errorf("remove the egress workload: %v", err)
		}
		for _, n := range c.Nodes {
			_ = c.Label(ctx, n.Name, kubecluster.WorkloadLabel, nil)
		}
		if err := kubecluster.Manifests.Uninstall(ctx, c); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		if err := c.ClearAgentState(); err != nil {
			t.Errorf("%v", err)
		}
		if err := c.Reregister(ctx); err != nil {
			t.Errorf("nodes joining anew: %v", err)
		}
	})
	if err := kubecluster.Manifests.Install(ctx, c); err != nil {
		t.Fatalf("install: %v", err)
	}
	if _, err := c.WaitInitialised(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAgents(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node2", "node3"} {
		if err := c.Label(ctx, n, kubecluster.WorkloadLabel, &yes); err != nil {
			t.Fatal(err)
		}
	}
	server := c.Lab.Remote.RecordSources(t, egressPort, 500000)
	if err := os.WriteFile(file, []byte(egressYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"leaver", "stayer"} {
		if _, err := c.Kubectl(ctx, "-n", "egress", "rollout", "status", "deployment/"+d, "--timeout", "2m"); err != nil {
			t.Fatal(err)
		}
	}
	var vip netip.Addr
	if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
		s, err := c.Client.CoreV1().Services("egress").Get(ctx, "leaver", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false, fmt.Sprintf("no address yet (%v)", err)
		}
		vip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	nodeAddr := map[string]netip.Addr{}
	for _, n := range c.Nodes {
		nodeAddr[n.Name] = n.Host.IPv4
	}

	ok := t.Run("the server sees only the VIP from the egress Service's pods on both nodes; the other Service's pods keep their node's address", func(t *testing.T) {
		// Until the rules are in, the pods leave as before: wait for a second of the VIP alone.
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			srcs := server.Since(time.Now().Add(-time.Second), "leaver-")
			by := map[string]bool{}
			for _, s := range srcs {
				if s.From != vip {
					return false, fmt.Sprintf("%s came from %s", s.Line, s.From)
				}
				by[strings.Fields(s.Line)[1]] = true
			}
			return by["node2"] && by["node3"], fmt.Sprintf("connections from the VIP in the last second by node: %v", by)
		}); err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		time.Sleep(3 * time.Second)
		counts := map[string]int{}
		for _, s := range server.Since(from, "") {
			f := strings.Fields(s.Line)
			if len(f) != 2 {
				t.Fatalf("a connection said %q", s.Line)
			}
			pod, node := f[0], f[1]
			want := vip
			if strings.HasPrefix(pod, "stayer-") {
				want = nodeAddr[node]
			}
			if s.From != want {
				t.Fatalf("%s on %s came from %s, want %s", pod, node, s.From, want)
			}
			counts[strings.SplitN(pod, "-", 2)[0]+" on "+node]++
		}
		for _, k := range []string{"leaver on node2", "leaver on node3", "stayer on node2", "stayer on node3"} {
			if counts[k] < 50 {
				t.Fatalf("connections in 3 s: %v; want at least 50 from each of %s", counts, k)
			}
		}
		owner, _ := c.Owner(vip)
		cond, _ := c.Kubectl(ctx, "-n", "egress", "get", "service", "leaver", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")].message}`)
		t.Logf("3 s of connections: %v; ARP for %s answered by %s; the Service's Egress condition: %s", counts, vip, owner, cond)
		if !strings.Contains(cond, "leave from egress node") {
			t.Fatalf("Egress condition %q does not name the egress node", cond)
		}
	})
	t.Run("egress in a pool that denies it: a Warning Event and a False condition, nothing else", func(t *testing.T) {
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			out, _ := c.Kubectl(ctx, "-n", "egress", "get", "service", "denied", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")].reason}`)
			ev := c.EventsSince(ctx, "egress", "EgressRefused", time.Time{})
			return out == "EgressRefused" && len(ev) > 0, fmt.Sprintf("condition reason %q, Events %v", out, ev)
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%v", c.EventsSince(ctx, "egress", "EgressRefused", time.Time{}))
	})
	if !ok {
		return
	}

	t.Run(fmt.Sprintf("the egress node killed hard, %d times: new connections leave from the VIP again through the next candidate", trials), func(t *testing.T) {
		var gaps []time.Duration
		for i := range trials {
			owner, err := c.WaitOwner(vip, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			revived := false
			defer func() {
				if !revived { // a failed trial: the node comes back for the rest
					_ = c.Node(owner).Revive()
				}
			}()
			other := "node2"
			if owner == "node2" {
				other = "node3"
			}
			at := time.Now()
			if err := c.Node(owner).Kill(); err != nil {
				t.Fatal(err)
			}
			// The outage is the longest pause between the surviving pod's connections from the
			// VIP around the kill (they come every 20 ms, the pause is the failover).
			time.Sleep(time.Until(at.Add(6 * time.Second)))
			var gap time.Duration
			last := at.Add(-100 * time.Millisecond)
			for _, s := range server.Since(last, "leaver-") {
				f := strings.Fields(s.Line)
				if len(f) != 2 || f[1] != other {
					continue // the dead node's pod: its last connections are of no interest
				}
				if s.From != vip {
					t.Fatalf("trial %d: %s killed, %q came from %s %s after the kill, want %s; rules on %s: %s",
						i+1, owner, s.Line, s.From, s.At.Sub(at).Round(time.Millisecond), vip, other, egressLeft(c.Node(other)))
				}
				gap, last = max(gap, s.At.Sub(last)), s.At
			}
			gap = max(gap, at.Add(6*time.Second).Sub(last))
			for _, s := range server.Since(at, "stayer-") {
				if f := strings.Fields(s.Line); len(f) == 2 && f[1] == other && s.From != nodeAddr[other] {
					t.Fatalf("trial %d: after the kill %q came from %s, want %s", i+1, s.Line, s.From, nodeAddr[other])
				}
			}
			gaps = append(gaps, gap)
			t.Logf("trial %d: %s killed, the pod on %s paused %s between connections from %s", i+1, owner, other, gap.Round(time.Millisecond), vip)
			if gap > 5*time.Second {
				t.Fatalf("trial %d: %s without egress", i+1, gap)
			}
			revived = true
			if err := c.Node(owner).Revive(); err != nil {
				t.Fatal(err)
			}
			if _, err := kubecluster.WaitFor(2*time.Minute, func() (bool, string) {
				srcs := server.Since(time.Now().Add(-time.Second), "leaver-")
				n := 0
				for _, s := range srcs {
					if strings.HasSuffix(s.Line, " "+owner) {
						if s.From != vip {
							return false, fmt.Sprintf("%q came from %s", s.Line, s.From)
						}
						n++
					}
				}
				return n > 10, fmt.Sprintf("%d connections from the VIP of the pod on %s in the last second", n, owner)
			}); err != nil {
				t.Fatalf("trial %d, %s revived: %v", i+1, owner, err)
			}
		}
		ms := make([]float64, 0, len(gaps))
		for _, g := range gaps {
			ms = append(ms, float64(g)/float64(time.Millisecond))
		}
		t.Logf("new connections from the VIP again after the egress node died, over %d trials: p50 %.0f ms, p99 %.0f ms (heartbeats every 50ms, dead after 3 misses)",
			trials, figure.Percentile(ms, 50), figure.Percentile(ms, 99))
	})

	t.Run("the annotation removed: every rule and route metalvip added is gone from every node, the pods leave as before", func(t *testing.T) {
		if _, err := c.Kubectl(ctx, "-n", "egress", "annotate", "service", "leaver", "metalvip.io/egress-"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Kubectl(ctx, "-n", "egress", "annotate", "service", "denied", "metalvip.io/egress-"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubecluster.WaitFor(time.Minute, func() (bool, string) {
			for _, n := range c.Nodes {
				if left := egressLeft(n); left != "" {
					return false, n.Name + ": " + left
				}
			}
			return true, ""
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := kubecluster.WaitFor(30*time.Second, func() (bool, string) {
			srcs := server.Since(time.Now().Add(-time.Second), "leaver-")
			for _, s := range srcs {
				if s.From == vip {
					return false, s.Line + " still leaves from the VIP"
				}
			}
			return len(srcs) > 10, fmt.Sprintf("%d connections in the last second", len(srcs))
		}); err != nil {
			t.Fatal(err)
		}
		cond, _ := c.Kubectl(ctx, "-n", "egress", "get", "service", "leaver", "-o", `jsonpath={.status.conditions[?(@.type=="metalvip.io/Egress")]}`)
		if cond != "" {
			t.Fatalf("the Egress condition stayed: %s", cond)
		}
	})
}

// egressLeft says what of metalvip's egress configuration node n still holds, or "".
func egressLeft(n *kubecluster.Node) string {
	var left []string
	if out, err := n.Exec("nft", "list", "table", "ip", "metalvip-egress"); err == nil {
		left = append(left, "nft table: "+out)
	}
	if out, _ := n.Exec("ip", "-4", "rule", "show"); out != "" {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "7470:") || strings.HasPrefix(l, "7471:") {
				left = append(left, "rule "+l)
			}
		}
	}
	if out, _ := n.Exec("ip", "-4", "route", "show", "table", "all"); out != "" {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "table 7473") {
				left = append(left, "route "+l)
			}
		}
	}
	return strings.Join(slices.Compact(left), "; ")
}
