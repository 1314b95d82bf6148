package kubecluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/test/lab"
	"github.com/metalvip/metalvip/test/testenv"
)

// The egress workload (docs/egress.md): pods that open a connection every 20 ms to a server
// behind the router, which records each connection's source address.

// EgressPort is where the server behind the router records its connections' sources.
const EgressPort = 9000

// EgressCloudConfig is the cloud-config egress needs (Cluster.CloudConfig): the pod and ClusterIP ranges
// and the nodes' segment (not the router's far side, where the server is).
const EgressCloudConfig = "    egress:\n      clusterCIDRs: [198.18.0.0/15, 198.51.100.0/25]\n"

// egressYAML: a pool that allows egress, announced from the workload nodes (node2, node3);
// one that does not; a BGP pool that allows it, announced from the workload nodes, with the
// lab's router as BGP peer; a client Deployment whose pods open a connection to the server
// every 20 ms, behind a Service that asks for egress; another such, behind a Service of the
// BGP pool that asks for it; another client, behind a Service that does not; and a Service
// asking for egress in the pool that denies it.
var egressYAML = `apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-egress}
spec:
  addresses: ["203.0.113.96/29"]
  autoAssign: false
  egress: Allow
  announce: {mode: L2, nodeSelector: {matchLabels: {` + WorkloadLabel + `: "true"}}}
---
apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-no-egress}
spec: {addresses: ["203.0.113.104/29"], autoAssign: false}
---
apiVersion: metalvip.io/v1alpha1
kind: IPPool
metadata: {name: kc-egress-bgp}
spec:
  addresses: ["` + egressBGPRange + `"]
  autoAssign: false
  egress: Allow
  announce: {mode: BGP, nodeSelector: {matchLabels: {` + WorkloadLabel + `: "true"}}}
---
apiVersion: metalvip.io/v1alpha1
kind: BGPPeer
metadata: {name: kc-egress-router}
spec: {address: 198.51.100.1, peerASN: 64496, myASN: 64497, ` + workloadBFD + `}
---
apiVersion: v1
kind: Namespace
metadata: {name: egress}
` + clientDeployment("leaver") + clientDeployment("bgpleaver") + clientDeployment("stayer") + `---
apiVersion: v1
kind: Service
metadata: {name: bgpleaver, namespace: egress, annotations: {metalvip.io/pool: kc-egress-bgp, metalvip.io/egress: "true"}}
spec: {type: LoadBalancer, selector: {app: bgpleaver}, ports: [{port: 80, targetPort: 8080}]}
---
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
            - matchExpressions: [{key: ` + WorkloadLabel + `, operator: In, values: ["true"]}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: ` + name + `}}}
      containers:
      - name: client
        image: example.test/httpd:v1
        imagePullPolicy: Never
        args: ["-dial", "198.51.100.130:` + fmt.Sprint(EgressPort) + `", "-every", "20ms"]
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        securityContext: {runAsNonRoot: true, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
`
}

// egressBGPRange is the BGP egress pool's range.
const egressBGPRange = "203.0.113.112/29"

// EgressNamespace holds the egress workload.
const EgressNamespace = "egress"

// Egress is the deployed egress workload.
type Egress struct {
	c *Cluster
	// Server records the sources of the connections to the server behind the router.
	Server *lab.SourceLog
	// VIP is the address of the Service leaver, whose pods leave from it; BGPVIP the BGP
	// address of the Service bgpleaver, whose pods leave from that.
	VIP, BGPVIP netip.Addr
	NodeAddr    map[string]netip.Addr
}

// Want is the address a connection of the egress workload must come from: its line names the
// pod and its node.
func (e *Egress) Want(line string) netip.Addr {
	f := strings.Fields(line)
	switch {
	case len(f) != 2:
		return netip.Addr{}
	case strings.HasPrefix(f[0], "stayer-"):
		return e.NodeAddr[f[1]]
	case strings.HasPrefix(f[0], "bgpleaver-"):
		return e.BGPVIP
	}
	return e.VIP
}

// DeployEgress labels node2 and node3 as workload nodes, starts the server behind the router
// (until t ends) and applies the egress workload: it waits until the pods run and the Service
// leaver has its address. The cluster's CCM must run with EgressCloudConfig.
func (c *Cluster) DeployEgress(ctx context.Context, t testenv.TB) (*Egress, error) {
	yes := "true"
	for _, n := range []string{"node2", "node3"} {
		if err := c.Label(ctx, n, WorkloadLabel, &yes); err != nil {
			return nil, err
		}
	}
	e := &Egress{c: c, Server: c.Lab.Remote.RecordSources(t, EgressPort, 500000), NodeAddr: map[string]netip.Addr{}}
	for _, n := range c.Nodes {
		e.NodeAddr[n.Name] = n.Host.IPv4
		// The lab makes the whole VIP range local on every node (for labs without
		// kube-proxy); a Kubernetes node with kube-proxy in iptables or nftables mode holds no
		// LoadBalancer address. The BGP egress pool's range is not local here either, so that
		// a reply reaching an announcer that is not the egress node is routed on, as on such a
		// node (docs/egress.md), instead of delivered to the lab's local route.
		if _, err := n.Exec("ip", "route", "replace", "throw", egressBGPRange, "table", "local"); err != nil {
			return nil, err
		}
	}
	file := filepath.Join(c.Dir, "egress.yaml")
	if err := os.WriteFile(file, []byte(egressYAML), 0o600); err != nil {
		return nil, err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", file); err != nil {
		return nil, err
	}
	for _, d := range []string{"leaver", "bgpleaver", "stayer"} {
		if _, err := c.Kubectl(ctx, "-n", EgressNamespace, "rollout", "status", "deployment/"+d, "--timeout", "2m"); err != nil {
			return nil, err
		}
	}
	for svc, vip := range map[string]*netip.Addr{"leaver": &e.VIP, "bgpleaver": &e.BGPVIP} {
		if _, err := WaitFor(time.Minute, func() (bool, string) {
			s, err := c.Client.CoreV1().Services(EgressNamespace).Get(ctx, svc, metav1.GetOptions{})
			if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
				return false, fmt.Sprintf("%s: no address yet (%v)", svc, err)
			}
			*vip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
			return err == nil, fmt.Sprint(err)
		}); err != nil {
			return e, err
		}
	}
	return e, nil
}

// RemoveEgress deletes the egress workload (the nodes keep their workload labels: the HTTP
// workload's, if any, are the same).
func (c *Cluster) RemoveEgress(ctx context.Context) error {
	_, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait", "--timeout", "2m", "-f", filepath.Join(c.Dir, "egress.yaml"))
	for _, n := range c.Nodes {
		_, _ = n.Exec("ip", "route", "del", "throw", egressBGPRange, "table", "local")
	}
	return err
}

// WaitVIPAlone waits until, for a second, every connection of the egress Services' pods
// came from their VIP, from pods of both Services on both workload nodes (until the agents'
// rules are in, they leave as before).
func (e *Egress) WaitVIPAlone(timeout time.Duration) error {
	_, err := WaitFor(timeout, func() (bool, string) {
		by := map[string]bool{}
		for _, s := range e.Server.Since(time.Now().Add(-time.Second), "") {
			f := strings.Fields(s.Line)
			if len(f) != 2 || strings.HasPrefix(f[0], "stayer-") {
				continue
			}
			if want := e.Want(s.Line); s.From != want {
				return false, fmt.Sprintf("%s came from %s, want %s", s.Line, s.From, want)
			}
			by[strings.SplitN(f[0], "-", 2)[0]+" on "+f[1]] = true
		}
		return len(by) == 4, fmt.Sprintf("connections from the VIPs in the last second by Service and node: %v", by)
	})
	return err
}

// EgressFailover is one hard kill of the egress node.
type EgressFailover struct {
	Victim, Survivor string
	// Pause is the longest time between two connections of the survivor's pod from the VIP
	// around the kill (they come every 20 ms: the pause is the failover); BGPPause the same
	// for the pod of the BGP address's Service (the victim may be its egress node too).
	Pause, BGPPause time.Duration
}

// KillEgressNode kills the node answering for the VIP hard, measures the pause of the egress
// pod on the other workload node, checks that every connection of the survivor's pods came
// from the right address (the VIP, the node's for the other Service's), then revives the node
// and waits until its pod leaves from the VIP again.
func (e *Egress) KillEgressNode(ctx context.Context) (EgressFailover, error) {
	c := e.c
	owner, err := c.WaitOwner(e.VIP, 20*time.Second)
	if err != nil {
		return EgressFailover{}, err
	}
	f := EgressFailover{Victim: owner, Survivor: "node2"}
	if owner == "node2" {
		f.Survivor = "node3"
	}
	at := time.Now()
	if err := c.Node(owner).Kill(); err != nil {
		return f, err
	}
	revived := false
	defer func() {
		if !revived {
			_ = c.Node(owner).Revive()
		}
	}()
	end := at.Add(6 * time.Second)
	time.Sleep(time.Until(end))
	last := at.Add(-100 * time.Millisecond)
	lastBGP := last
	for _, s := range e.Server.Since(last, "") {
		fields := strings.Fields(s.Line)
		if len(fields) != 2 || fields[1] != f.Survivor {
			continue // the dead node's pods: their last connections are of no interest
		}
		want := e.Want(s.Line)
		if s.From != want {
			return f, fmt.Errorf("%s killed, %q came from %s %s after the kill, want %s; egress rules on %s: %s",
				owner, s.Line, s.From, s.At.Sub(at).Round(time.Millisecond), want, f.Survivor, c.Node(f.Survivor).EgressLeft())
		}
		switch want {
		case e.VIP:
			f.Pause, last = max(f.Pause, s.At.Sub(last)), s.At
		case e.BGPVIP:
			f.BGPPause, lastBGP = max(f.BGPPause, s.At.Sub(lastBGP)), s.At
		}
	}
	f.Pause = max(f.Pause, end.Sub(last))
	f.BGPPause = max(f.BGPPause, end.Sub(lastBGP))
	revived = true
	if err := c.Node(owner).Revive(); err != nil {
		return f, err
	}
	_, err = WaitFor(2*time.Minute, func() (bool, string) {
		n := map[string]int{}
		for _, s := range e.Server.Since(time.Now().Add(-time.Second), "") {
			if f := strings.Fields(s.Line); len(f) == 2 && f[1] == owner && !strings.HasPrefix(f[0], "stayer-") {
				if want := e.Want(s.Line); s.From != want {
					return false, fmt.Sprintf("%q came from %s, want %s", s.Line, s.From, want)
				}
				n[strings.SplitN(f[0], "-", 2)[0]]++
			}
		}
		return n["leaver"] > 10 && n["bgpleaver"] > 10, fmt.Sprintf("connections from the VIPs of the pods on %s in the last second: %v", owner, n)
	})
	if err != nil {
		return f, fmt.Errorf("%s revived: %w", owner, err)
	}
	return f, nil
}

// EgressLeft says what of metalvip's egress configuration the node holds: its nftables
// tables, its ip rules (priorities 7470 to 7472) and routes in its tables (7473000 on), of
// both families; "" when none.
func (n *Node) EgressLeft() string {
	var left []string
	for _, f := range []string{"ip", "ip6"} {
		if out, err := n.Exec("nft", "list", "table", f, "metalvip-egress"); err == nil {
			left = append(left, "nft table: "+out)
		}
	}
	for _, f := range []string{"-4", "-6"} {
		if out, _ := n.Exec("ip", f, "rule", "show"); out != "" {
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "7470:") || strings.HasPrefix(l, "7471:") || strings.HasPrefix(l, "7472:") {
					left = append(left, "rule "+l)
				}
			}
		}
		if out, _ := n.Exec("ip", f, "route", "show", "table", "all"); out != "" {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "table 7473") {
					left = append(left, "route "+l)
				}
			}
		}
	}
	return strings.Join(slices.Compact(left), "; ")
}
