package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/annotation"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

// Status is what `metalvipctl status` reports.
type Status struct {
	Pools    []PoolStatus    `json:"pools"`
	Services []ServiceStatus `json:"services"`
	Agents   []AgentStatus   `json:"agents"`
}

// PoolStatus is one IPPool.
type PoolStatus struct {
	Name          string `json:"name"`
	Mode          string `json:"mode"`
	AllocatedIPv4 int64  `json:"allocatedIPv4"`
	AvailableIPv4 int64  `json:"availableIPv4"`
	AllocatedIPv6 int64  `json:"allocatedIPv6"`
	AvailableIPv6 int64  `json:"availableIPv6"`
	Ready         string `json:"ready"`
	Message       string `json:"message,omitempty"`
}

// ServiceStatus is one LoadBalancer Service.
type ServiceStatus struct {
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	Addresses   []string `json:"addresses"`
	Pool        string   `json:"pool,omitempty"`
	AnnouncedBy string   `json:"announcedBy,omitempty"`
	Pending     string   `json:"pending,omitempty"`
}

// AgentStatus is one node's agent, as the CCM sees it.
type AgentStatus struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	Agent   string `json:"agent"`
	Since   string `json:"since,omitempty"`
}

func statusCommand() *cobra.Command {
	var kubeconfig, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show pools, Services with their addresses and announcing nodes, and agent health",
		Long: `status reads the cluster (like kubectl: --kubeconfig, else $KUBECONFIG, else ~/.kube/config)
and shows the IP pools (used and free), every LoadBalancer Service with its addresses and the
node announcing them (from the CCM's Announced and TookOver Events), and whether the CCM reaches
each node's agent (from its AgentReachable and AgentUnreachable Events).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: give table or json", output)
			}
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st, err := gather(ctx, client, dyn)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printTable(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "path of the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

var answeredBy = regexp.MustCompile(`is (answered|advertised) by ([^(]+?)(?:, standby ([^(]+?))?(?: \(|$)`)

// eventAddress is the address an Announced or TookOver Event is about: "203.0.113.1 (L2) is
// answered by ..." or "Node n answers for 203.0.113.1 now: ...".
func eventAddress(e corev1.Event) string {
	f := strings.Fields(e.Message)
	if (e.Reason == "TookOver" || strings.HasPrefix(e.Message, "No node may announce")) && len(f) > 4 {
		return strings.TrimSuffix(f[4], ":")
	}
	if len(f) > 0 {
		return f[0]
	}
	return ""
}

// announcedBy is who an Announced or TookOver Event says announces its address.
func announcedBy(e corev1.Event) string {
	if e.Reason == "TookOver" {
		return strings.TrimPrefix(strings.SplitN(e.Message, " answers", 2)[0], "Node ") + " (took over)"
	}
	m := answeredBy.FindStringSubmatch(e.Message)
	if m == nil {
		return e.Message
	}
	by := m[2]
	switch {
	case strings.Contains(e.Message, "(L2 per client)"):
		by += " (per client)"
	case m[3] != "":
		by += " (standby " + m[3] + ")"
	}
	return by
}

func gather(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface) (*Status, error) {
	st := &Status{Pools: []PoolStatus{}, Services: []ServiceStatus{}, Agents: []AgentStatus{}}
	pools, err := dyn.Resource(v1alpha1.IPPoolResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list IPPools (are metalvip's CRDs installed?): %w", err)
	}
	// poolOf finds the pool holding an address, for Services whose allocation record (written
	// a moment after the address) is not there yet.
	type poolRange struct {
		pool string
		r    ipam.Range
	}
	var ranges []poolRange
	poolOf := func(a netip.Addr) string {
		for _, pr := range ranges {
			if pr.r.Contains(a) {
				return pr.pool
			}
		}
		return ""
	}
	for _, u := range pools.Items {
		p := &v1alpha1.IPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			continue
		}
		for _, s := range p.Spec.Addresses {
			if r, err := ipam.ParseRange(string(s)); err == nil {
				ranges = append(ranges, poolRange{p.Name, r})
			}
		}
		ps := PoolStatus{Name: p.Name, Mode: string(p.Spec.Announce.Mode), AllocatedIPv4: p.Status.AllocatedIPv4, AvailableIPv4: p.Status.AvailableIPv4,
			AllocatedIPv6: p.Status.AllocatedIPv6, AvailableIPv6: p.Status.AvailableIPv6, Ready: "Unknown"}
		if ps.Mode == "" {
			ps.Mode = string(v1alpha1.AnnounceL2)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.PoolReady {
				ps.Ready = string(c.Status)
				if c.Status != metav1.ConditionTrue {
					ps.Message = c.Message
				}
			}
		}
		st.Pools = append(st.Pools, ps)
	}
	events, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Events: %w", err)
	}
	latest := map[string]corev1.Event{} // kind/namespace/name/reason-group -> newest
	for _, e := range events.Items {
		var group string
		switch e.Reason {
		case "Announced", "TookOver":
			// One per address: a Service with several has one of each per address.
			group = "announce/" + eventAddress(e)
		case "AgentReachable", "AgentUnreachable":
			group = "agent"
		case "PoolExhausted", "IPInUse", "SharingConflict", "NoPool", "InvalidRequest", "InvalidAnnotation":
			group = "pending"
		default:
			continue
		}
		obj := e.InvolvedObject.Kind + "/" + e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name + "/"
		keys := []string{obj + group}
		if e.Reason == "Announced" {
			keys = append(keys, obj+"announced/"+eventAddress(e))
		}
		for _, k := range keys {
			if old, ok := latest[k]; !ok || newer(e, old) {
				latest[k] = e
			}
		}
	}
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Services: %w", err)
	}
	for _, s := range svcs.Items {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer || s.Spec.LoadBalancerClass != nil {
			continue
		}
		ss := ServiceStatus{Namespace: s.Namespace, Name: s.Name, Addresses: []string{}}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(ing.IP); err == nil {
				ss.Addresses = append(ss.Addresses, a.String())
			}
		}
		ss.Pool, _ = annotation.AllocatedPool.Value(&s)
		if ss.Pool == "" && len(ss.Addresses) > 0 {
			ss.Pool = poolOf(netip.MustParseAddr(ss.Addresses[0]))
		}
		var by []string
		for _, a := range ss.Addresses {
			e, ok := latest["Service/"+s.Namespace+"/"+s.Name+"/announce/"+a]
			if !ok {
				continue
			}
			// Every candidate of a per-client VIP answers: the CCM's word on who shares it
			// says more than the newest agent's TookOver.
			if pc, ok := latest["Service/"+s.Namespace+"/"+s.Name+"/announced/"+a]; ok && strings.Contains(pc.Message, "(L2 per client)") {
				e = pc
			}
			who := announcedBy(e)
			if len(ss.Addresses) > 1 {
				who = a + ": " + who
			}
			by = append(by, who)
		}
		ss.AnnouncedBy = strings.Join(by, "; ")
		if len(ss.Addresses) == 0 {
			ss.Pending = "waiting for an address"
			if e, ok := latest["Service/"+s.Namespace+"/"+s.Name+"/pending"]; ok {
				ss.Pending = e.Reason + ": " + e.Message
			}
		}
		st.Services = append(st.Services, ss)
	}
	slices.SortFunc(st.Services, func(a, b ServiceStatus) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		as := AgentStatus{Node: n.Name, Agent: "unknown"}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				as.Address = a.Address
				break
			}
		}
		if e, ok := latest["Node//"+n.Name+"/agent"]; ok {
			as.Agent = map[string]string{"AgentReachable": "reachable", "AgentUnreachable": "unreachable"}[e.Reason]
			as.Since = eventTime(e).UTC().Format(time.RFC3339)
		}
		st.Agents = append(st.Agents, as)
	}
	return st, nil
}

// newer reports whether a happened after b. Event times have whole seconds: within one second
// the later write wins, by resourceVersion (etcd's revision, which grows with every write).
func newer(a, b corev1.Event) bool {
	ta, tb := eventTime(a), eventTime(b)
	if !ta.Equal(tb) {
		return ta.After(tb)
	}
	ra, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	rb, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return errA == nil && errB == nil && ra > rb
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	default:
		return e.CreationTimestamp.Time
	}
}

func printTable(out io.Writer, st *Status) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "POOL\tMODE\tIPV4 USED\tIPV4 FREE\tIPV6 USED\tIPV6 FREE\tREADY")
	for _, p := range st.Pools {
		ready := p.Ready
		if p.Message != "" {
			ready += " (" + p.Message + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", p.Name, p.Mode, p.AllocatedIPv4, p.AvailableIPv4, p.AllocatedIPv6, p.AvailableIPv6, ready)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SERVICE\tADDRESSES\tPOOL\tANNOUNCED BY")
	for _, s := range st.Services {
		addrs := strings.Join(s.Addresses, ",")
		by := s.AnnouncedBy
		if s.Pending != "" {
			addrs, by = "<pending>", s.Pending
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\n", s.Namespace, s.Name, addrs, s.Pool, by)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NODE\tADDRESS\tAGENT\tSINCE")
	for _, a := range st.Agents {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Node, a.Address, a.Agent, a.Since)
	}
	w.Flush()
}
