package kubecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/test/harness/probe"
)

// WorkloadLabel marks the nodes the workload's pods may run on.
const WorkloadLabel = "kubecluster.metalvip.io/workload"

// WorkloadNamespace holds the workload's Deployment and Services.
const WorkloadNamespace = "web"

// The workload's Services: L2 and BGP, each with externalTrafficPolicy Cluster and Local.
const (
	ServiceL2         = "web-l2"
	ServiceL2Local    = "web-l2-local"
	ServiceBGP        = "web-bgp"
	ServiceBGPLocal   = "web-bgp-local"
	WorkloadSelector  = "app=web"
	CCMSelector       = "app.kubernetes.io/name=metalvip-cloud-controller-manager"
	AgentSelector     = "app.kubernetes.io/name=metalvip-agent"
	AgentDaemonSet    = "metalvip-agent"
	CCMDeployment     = "metalvip-cloud-controller-manager"
	MetalvipNamespace = "kube-system"
)

// workloadYAML: an L2 pool, a BGP pool (by name only) and the lab's router as BGP peer (with
// graceful restart, so that it keeps a restarting agent's routes: an upgrade moves nothing; BFD
// at 300 ms, as 100 ms flaps sessions when the shared machine starves a daemon, and no test
// here measures BGP failover); the
// HTTP server as a Deployment on the labelled nodes, one pod per node; a LoadBalancer Service
// per mode and traffic policy.
// workloadBFD is the BGPPeer's BFD (a detection time of 900 ms), and tolerantBFD the one of a
// cluster with a tolerant heartbeat profile (Cluster.Failover, 3 s): in CI, beside another
// package's tests, an agent restarted by a rollback stalled past 900 ms, its BFD session expired
// and the router ended the BGP session, taking the node out of the ECMP set and resetting long
// connections (a fault of the machine, not of the restart).
const (
	workloadBFD = "bfd: {enabled: true, minRxMilliseconds: 300, minTxMilliseconds: 300, multiplier: 3}"
	tolerantBFD = "bfd: {enabled: true, minRxMilliseconds: 1000, minTxMilliseconds: 1000, multiplier: 3}"
)

const workloadYAML = `apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-l2}
spec: {addresses: ["203.0.113.0/27"], avoidBuggyIPs: true}
---
apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-bgp}
spec: {addresses: ["203.0.113.64/27"], autoAssign: false, announce: {mode: BGP}}
---
apiVersion: metalvip.io/v1alpha1
kind: BGPPeer
metadata: {name: router}
spec: {address: 198.51.100.1, peerASN: 64496, myASN: 64497, gracefulRestart: true, ` + workloadBFD + `}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      automountServiceAccountToken: false
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: ` + WorkloadLabel + `, operator: In, values: ["true"]}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: web
        image: example.test/httpd:v1
        imagePullPolicy: Never
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
        securityContext: {runAsNonRoot: true, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {name: web-l2, namespace: web}
spec: {type: LoadBalancer, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-l2-local, namespace: web}
spec: {type: LoadBalancer, externalTrafficPolicy: Local, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-bgp, namespace: web, annotations: {metalvip.io/pool: kc-bgp}}
spec: {type: LoadBalancer, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-bgp-local, namespace: web, annotations: {metalvip.io/pool: kc-bgp}}
spec: {type: LoadBalancer, externalTrafficPolicy: Local, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
`

// Workload is the deployed workload: the Services' addresses.
type Workload struct {
	VIPs map[string]netip.Addr // by Service name
}

// DeployWorkload labels the workload's nodes, applies the pools, the peer, the Deployment and
// the Services, and waits until the pods are ready and every Service has an address.
func (c *Cluster) DeployWorkload(ctx context.Context, nodes ...string) (*Workload, error) {
	yes := "true"
	for _, n := range nodes {
		if err := c.Label(ctx, n, WorkloadLabel, &yes); err != nil {
			return nil, err
		}
	}
	f := filepath.Join(c.Dir, "workload.yaml")
	workload := workloadYAML
	if c.Failover != nil {
		workload = strings.Replace(workload, workloadBFD, tolerantBFD, 1)
	}
	if err := os.WriteFile(f, []byte(workload), 0o600); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", f); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, "-n", WorkloadNamespace, "rollout", "status", "deployment/web", "--timeout", "2m"); err != nil {
		return nil, err
	}
	w := &Workload{VIPs: map[string]netip.Addr{}}
	for _, name := range []string{ServiceL2, ServiceL2Local, ServiceBGP, ServiceBGPLocal} {
		var vip netip.Addr
		if _, err := WaitFor(time.Minute, func() (bool, string) {
			s, err := c.Client.CoreV1().Services(WorkloadNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, in := range s.Status.LoadBalancer.Ingress {
				if a, err := netip.ParseAddr(in.IP); err == nil {
					vip = a
					return true, ""
				}
			}
			return false, "no address in the status"
		}); err != nil {
			return nil, fmt.Errorf("service %s: %w", name, err)
		}
		w.VIPs[name] = vip
	}
	return w, nil
}

// RemoveWorkload deletes the workload, its pools and peer, and the nodes' labels.
func (c *Cluster) RemoveWorkload(ctx context.Context) error {
	f := filepath.Join(c.Dir, "workload.yaml")
	_, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait", "--timeout", "2m", "-f", f)
	for _, n := range c.Nodes {
		_ = c.Label(ctx, n.Name, WorkloadLabel, nil)
	}
	return err
}

// ScaleWorkload sets the Deployment's replicas and waits for the rollout.
func (c *Cluster) ScaleWorkload(ctx context.Context, replicas int) error {
	if _, err := c.Kubectl(ctx, "-n", WorkloadNamespace, "scale", "deployment/web", fmt.Sprintf("--replicas=%d", replicas)); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "-n", WorkloadNamespace, "rollout", "status", "deployment/web", "--timeout", "2m")
	return err
}

// ReadyWorkloadNodes returns the nodes running a ready pod of the workload, sorted.
func (c *Cluster) ReadyWorkloadNodes(ctx context.Context) ([]string, error) {
	pods, err := c.PodsOn(ctx, WorkloadNamespace, WorkloadSelector, true)
	if err != nil {
		return nil, err
	}
	var out []string
	for n := range pods {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// WaitNextHops waits until the router routes vip to exactly want (sorted node names).
func (c *Cluster) WaitNextHops(vip netip.Addr, want []string, timeout time.Duration) (time.Duration, error) {
	return WaitFor(timeout, func() (bool, string) {
		hops, err := c.NextHops(vip)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(hops, want), fmt.Sprintf("next hops %v, want %v", hops, want)
	})
}

// Failover is one measured failover: what died, who answered before and after, the longest
// outage the client saw and the probes lost of those sent; and, once the node came back, the
// longest outage while it returned.
type Failover struct {
	Victim, After string
	// Plan is the Announced condition's message of the VIP's Service at the kill (who
	// answers, who stands by, as the CCM planned it).
	Plan string
	// Agent is what the new owner's agent logged about the VIP from the kill on (its
	// takeover: why, and how long after the dead owner's last heartbeat).
	Agent string
	// ProxyWait is how long the kill waited for the kube-proxies of the nodes running a
	// ready pod to report a local endpoint of the VIP's Service.
	ProxyWait  time.Duration
	Outage     time.Duration
	Lost, Sent int
	// Return is the longest outage from the node's revival until it settled and 3 s more
	// (zero when nothing was lost); ReturnLost the probes lost meanwhile.
	Return     time.Duration
	ReturnLost int
}

func (f Failover) String() string {
	return fmt.Sprintf("%s died, %s answered after %s (%d of %d probes lost); its return cost %s (%d probes lost); planned: %s (kube-proxies ready after %s); %s logged: %s",
		f.Victim, f.After, f.Outage.Round(time.Millisecond), f.Lost, f.Sent, f.Return.Round(time.Millisecond), f.ReturnLost, f.Plan, f.ProxyWait.Round(time.Millisecond), f.After, f.Agent)
}

// ProbeInterval is the client's HTTP probe cadence in the failover measurements.
const ProbeInterval = 20 * time.Millisecond

// WaitOwner waits until some node answers ARP for vip and returns it.
func (c *Cluster) WaitOwner(vip netip.Addr, timeout time.Duration) (string, error) {
	var owner string
	_, err := WaitFor(timeout, func() (bool, string) {
		var err error
		owner, err = c.Owner(vip)
		return owner != "", fmt.Sprintf("nobody answers ARP for %s (%v)", vip, err)
	})
	return owner, err
}

// KillOwner kills the node answering for the L2 address vip hard while the client probes it
// over HTTP every 20 ms, and measures the outage until a probe is answered again (through the
// next candidate's kube-proxy, to its pod). Then it revives the node, waits until the node's
// agent and pods are ready again, and measures what its return cost the client. vip is the
// address of a Service with externalTrafficPolicy Local: the kill waits until the kube-proxy
// of every node running a ready pod routes it to that pod (ProxiesReady).
func (c *Cluster) KillOwner(ctx context.Context, vip netip.Addr) (Failover, error) {
	return c.killOwner(ctx, vip, nil)
}

// KillOwnerAfter is KillOwner without waiting for the kube-proxies: once the client's probes
// are answered, prepare is called with the owner (e.g. to make a pod on another node fresh,
// FreshPod) and the owner dies at the time it returns.
func (c *Cluster) KillOwnerAfter(ctx context.Context, vip netip.Addr, prepare func(owner string) (time.Time, error)) (Failover, error) {
	return c.killOwner(ctx, vip, prepare)
}

func (c *Cluster) killOwner(ctx context.Context, vip netip.Addr, prepare func(owner string) (time.Time, error)) (Failover, error) {
	owner, err := c.WaitOwner(vip, 20*time.Second)
	if err != nil {
		return Failover{}, err
	}
	prober, err := probe.StartHTTP(c.Lab.Client, netip.AddrPortFrom(vip, 80), ProbeInterval, 250*time.Millisecond, 20000)
	if err != nil {
		return Failover{}, err
	}
	defer func() { _ = prober.Stop() }()
	if _, err := WaitFor(5*time.Second, func() (bool, string) { return prober.Answered(), prober.LastError() }); err != nil {
		return Failover{}, fmt.Errorf("%s not answering before the kill: %w", vip, err)
	}
	f := Failover{Victim: owner}
	// The candidates' kube-proxies must route the VIP to their own pods before the kill, or
	// the measurement counts kube-proxy catching up with a pod that has just become ready:
	// a takeover by a node whose kube-proxy does not yet know its local pod drops every
	// connection until its next sync (a kill about a second after DeployWorkload cost 360-620 ms so: the standby's kube-proxy
	// answered 503 on the health check port and synced 380 ms after the kill).
	var killAt time.Time
	if prepare == nil {
		start := time.Now()
		if _, err := WaitFor(30*time.Second, func() (bool, string) { return c.ProxiesReady(ctx, vip) }); err != nil {
			return f, fmt.Errorf("kube-proxy before the kill: %w", err)
		}
		f.ProxyWait = time.Since(start)
	} else if killAt, err = prepare(owner); err != nil {
		return f, err
	}
	f.Plan, _ = c.Announced(ctx, vip)
	// One node answers before the kill: with two, the client may already send to the other
	// and the kill measures nothing (a trial once measured 5.9 ms so).
	if macs, err := c.Lab.Client.AskNeighbor(vip, 300*time.Millisecond, false); err != nil || len(macs) != 1 {
		names, _ := c.MACs()
		var by []string
		for _, m := range macs {
			by = append(by, m+" ("+names[m]+")")
		}
		return f, fmt.Errorf("%s answered by %v before the kill (%v); want %s alone", vip, by, err, owner)
	}
	time.Sleep(time.Until(killAt))
	at := time.Now()
	if err := c.Node(owner).Kill(); err != nil {
		return f, err
	}
	if _, err := WaitFor(10*time.Second, func() (bool, string) {
		return time.Since(at) > time.Second && prober.Answered(), prober.LastError()
	}); err != nil {
		return f, fmt.Errorf("%s not answered again after %s died: %w", vip, owner, err)
	}
	o := prober.OutageBetween(at.Add(-ProbeInterval), time.Now())
	f.Outage, f.Lost, f.Sent = o.Longest, o.Lost, o.Sent
	f.After, _ = c.Owner(vip)
	f.Agent = c.agentLog(ctx, f.After, at, vip.String())
	back := time.Now()
	if err := c.ReviveAndSettle(ctx, owner, 2*time.Minute); err != nil {
		return f, fmt.Errorf("revive %s: %w", owner, err)
	}
	time.Sleep(5 * time.Second) // heartbeats heard both ways, the plan pushed again
	o = prober.OutageBetween(back, time.Now().Add(-time.Second))
	f.Return, f.ReturnLost = o.Longest, o.Lost
	return f, nil
}

// FreshPod deletes the workload's pod on node and waits until its replacement there is
// Ready (the Deployment's spread puts it back on the node); it returns when it saw it Ready
// (polled every 20 ms).
func (c *Cluster) FreshPod(ctx context.Context, node string) (time.Time, error) {
	pods, err := c.PodsOn(ctx, WorkloadNamespace, WorkloadSelector, false)
	if err != nil {
		return time.Time{}, err
	}
	if len(pods[node]) != 1 {
		return time.Time{}, fmt.Errorf("%d workload pods on %s, want 1", len(pods[node]), node)
	}
	old := pods[node][0].Name
	if err := c.Client.CoreV1().Pods(WorkloadNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		return time.Time{}, err
	}
	var ready time.Time
	_, err = WaitForEvery(20*time.Millisecond, time.Minute, func() (bool, string) {
		pods, err := c.PodsOn(ctx, WorkloadNamespace, WorkloadSelector, true)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods[node] {
			if p.Name != old {
				ready = time.Now()
				return true, ""
			}
		}
		return false, fmt.Sprintf("no ready replacement of %s on %s yet", old, node)
	})
	return ready, err
}

// agentLog returns the lines of node's agent pod logged from since on that contain match.
func (c *Cluster) agentLog(ctx context.Context, node string, since time.Time, match string) string {
	pods, err := c.PodsOn(ctx, MetalvipNamespace, AgentSelector, false)
	if err != nil {
		return err.Error()
	}
	if len(pods[node]) == 0 {
		return "no agent pod on " + node
	}
	p := pods[node][0]
	t := metav1.NewTime(since)
	raw, err := c.Client.CoreV1().Pods(MetalvipNamespace).GetLogs(p.Name, &corev1.PodLogOptions{SinceTime: &t}).DoRaw(ctx)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for l := range strings.Lines(string(raw)) {
		if strings.Contains(l, match) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, " | ")
}

// ProxiesReady reports whether the kube-proxy of every node running a ready workload pod
// says (on the health check node port of the Service whose address is vip, which it serves
// from the rules it has written) that it has a local endpoint, as a cloud load balancer
// checks before sending a node traffic. The Service must have externalTrafficPolicy Local.
func (c *Cluster) ProxiesReady(ctx context.Context, vip netip.Addr) (bool, string) {
	svc, err := c.serviceOf(ctx, vip)
	if err != nil {
		return false, err.Error()
	}
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		return false, "service " + svc.Name + " has no health check node port (externalTrafficPolicy Local?)"
	}
	ready, err := c.ReadyWorkloadNodes(ctx)
	if err != nil {
		return false, err.Error()
	}
	if len(ready) == 0 {
		return false, "no ready workload pod"
	}
	for _, name := range ready {
		n := c.Node(name)
		if n == nil {
			return false, "no node " + name
		}
		body, err := probe.Get(c.Lab.Client, netip.AddrPortFrom(n.Host.IPv4, uint16(port)), time.Second)
		if err != nil {
			return false, fmt.Sprintf("kube-proxy on %s: %v", name, err)
		}
		var h struct {
			LocalEndpoints int `json:"localEndpoints"`
		}
		if err := json.Unmarshal([]byte(body), &h); err != nil || h.LocalEndpoints == 0 {
			return false, fmt.Sprintf("kube-proxy on %s: %q", name, body)
		}
	}
	return true, ""
}

// serviceOf returns the workload Service whose address is vip.
func (c *Cluster) serviceOf(ctx context.Context, vip netip.Addr) (*corev1.Service, error) {
	list, err := c.Client.CoreV1().Services(WorkloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i, s := range list.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP == vip.String() {
				return &list.Items[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no workload Service has the address %s", vip)
}

// Announced returns the Announced condition's message of the workload Service whose address
// is vip.
func (c *Cluster) Announced(ctx context.Context, vip netip.Addr) (string, error) {
	s, err := c.serviceOf(ctx, vip)
	if err != nil {
		return "", err
	}
	for _, cond := range s.Status.Conditions {
		if cond.Type == desired.ConditionAnnounced {
			return cond.Message, nil
		}
	}
	return "", fmt.Errorf("service %s has no %s condition", s.Name, desired.ConditionAnnounced)
}

// ReviveAndSettle brings a killed node back and waits until its agent pod and workload pods
// are ready again and the CCM reaches the agent again (its AgentReachable Event), so that the
// next measurement starts from a steady cluster.
func (c *Cluster) ReviveAndSettle(ctx context.Context, node string, timeout time.Duration) error {
	revived := time.Now().Add(-time.Second) // Event times have a resolution of a second
	if err := c.Node(node).Revive(); err != nil {
		return err
	}
	_, err := WaitFor(timeout, func() (bool, string) {
		if reached, why := c.agentReachedSince(ctx, node, revived); !reached {
			return false, why
		}
		agents, err := c.PodsOn(ctx, MetalvipNamespace, AgentSelector, true)
		if err != nil {
			return false, err.Error()
		}
		if len(agents[node]) == 0 {
			return false, "no ready agent pod on " + node
		}
		labels, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if labels.Labels[WorkloadLabel] == "true" {
			pods, err := c.PodsOn(ctx, WorkloadNamespace, WorkloadSelector, true)
			if err != nil {
				return false, err.Error()
			}
			if len(pods[node]) == 0 {
				return false, "no ready workload pod on " + node
			}
		}
		return true, ""
	})
	return err
}

// agentReachedSince reports whether the CCM said (an AgentReachable Event on the Node) that
// it reached node's agent at or after since.
func (c *Cluster) agentReachedSince(ctx context.Context, node string, since time.Time) (bool, string) {
	events, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=AgentReachable"})
	if err != nil {
		return false, err.Error()
	}
	for _, e := range events.Items {
		last := e.LastTimestamp.Time
		if e.Series != nil && e.Series.LastObservedTime.After(last) {
			last = e.Series.LastObservedTime.Time
		}
		if e.EventTime.After(last) {
			last = e.EventTime.Time
		}
		if !last.Before(since) {
			return true, ""
		}
	}
	return false, "the CCM has not reached the agent on " + node + " since its revival"
}

// Describe returns a short text of the cluster's pods and nodes, for failure reports.
func (c *Cluster) Describe(ctx context.Context) string {
	var b strings.Builder
	for _, args := range [][]string{{"get", "nodes", "-o", "wide", "--show-labels"}, {"get", "pods", "-A", "-o", "wide"}, {"get", "svc", "-A"}, {"get", "events", "-A", "--sort-by=.lastTimestamp"}} {
		out, err := c.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}
