package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/announcer"
	"github.com/metalvip/metalvip/loadbalancer/desired"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/loadbalancer/report"
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
	// Announced is who announces each address, as the CCM's ServiceAnnouncement says.
	Announced []v1alpha1.AnnouncedAddress `json:"announced,omitempty"`
	Pending   string                      `json:"pending,omitempty"`
	// Egress is the Service's Egress condition (docs/egress.md): from which node its pods
	// leave, or why not; empty when it does not ask.
	Egress string `json:"egress,omitempty"`
}

// AgentStatus is one node's agent, as the CCM sees it.
type AgentStatus struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	Agent   string `json:"agent"`
	Since   string `json:"since,omitempty"`
}

func statusCommand() *cobra.Command {
	var class string
	var kube *genericclioptions.ConfigFlags
	var out *printFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show pools, Services with their addresses and announcing nodes, and agent health",
		Long: `status reads the cluster (with kubectl's flags: --kubeconfig, else $KUBECONFIG, else
~/.kube/config; --context, --namespace to show one namespace's Services) and shows the IP pools (used and free), every LoadBalancer Service with its addresses and the
nodes announcing them (from the Service's ServiceAnnouncement, the record the CCM keeps up to
date), and whether the CCM reaches each node's agent (from the Node's
metalvip.io/AgentReachable condition). An announcing node whose agent the CCM cannot reach is
marked stale. For what one node does right now, ask its agent: metalvipctl agent NODE.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			client, dyn, _, err := kubeClients(kube)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st, err := gather(ctx, client, dyn, desired.Serves{Class: class, Classless: true}, namespaceFlag(cmd, kube))
			if err != nil {
				return err
			}
			return writeStatus(cmd.OutOrStdout(), st, out)
		},
	}
	kube = kubeFlags(cmd)
	out = addPrintFlags(cmd)
	cmd.Flags().StringVar(&class, "class", desired.DefaultServes.Class, "the loadBalancerClass metalvip serves (its cloud-config services.loadBalancerClass); class-less Services are shown too")
	return cmd
}

// announcedBy describes who announces one address, from the Service's Announced condition.
func announcedBy(a desired.Address) string {
	var by string
	switch {
	case len(a.Nodes) == 0:
		by = "no eligible node"
	case a.Mode == desired.ModeL2PerClient:
		by = strings.Join(a.Nodes, ", ") + " (per client)"
	case a.Mode == desired.ModeL2 && len(a.Nodes) > 1:
		by = a.Nodes[0] + " (standby " + strings.Join(a.Nodes[1:], ", ") + ")"
	default:
		by = strings.Join(a.Nodes, ", ")
	}
	if len(a.RefusedBy) > 0 {
		by += "; refused by " + strings.Join(a.RefusedBy, ", ")
	}
	return by
}

// describeRecord says who announces each address of svc, from its record, and marks what may
// be stale: a node whose agent the CCM cannot reach, a spec the CCM has not seen.
func describeRecord(rec *v1alpha1.ServiceAnnouncement, svc *corev1.Service, unreachable map[string]string) string {
	addrs, err := desired.FromRecord(rec.Addresses)
	if err != nil {
		return "unreadable ServiceAnnouncement: " + err.Error()
	}
	var by []string
	stale := map[string]bool{}
	for _, a := range addrs {
		who := announcedBy(a)
		if len(addrs) > 1 {
			who = a.Addr.String() + ": " + who
		}
		by = append(by, who)
		for _, n := range a.Nodes {
			if _, down := unreachable[n]; down {
				stale[n] = true
			}
		}
	}
	out := strings.Join(by, "; ")
	for _, n := range slices.Sorted(maps.Keys(stale)) {
		out += fmt.Sprintf(" [stale: the agent of %s is unreachable since %s, it may have stopped]", n, unreachable[n])
	}
	if rec.ObservedGeneration < svc.Generation {
		out += " [stale: the CCM has not seen the Service's latest spec]"
	}
	return out
}

// gather reads what status shows: every pool and agent, and the Services of namespace ("":
// of every namespace).
func gather(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, serves desired.Serves, namespace string) (*Status, error) {
	st := &Status{Pools: []PoolStatus{}, Services: []ServiceStatus{}, Agents: []AgentStatus{}}
	list, err := dyn.Resource(v1alpha1.IPPoolResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list IPPools (are metalvip's CRDs installed?): %w", err)
	}
	var decoded []*pools.Pool
	for i := range list.Items {
		u := &list.Items[i]
		p := pools.DecodePool(u)
		decoded = append(decoded, p)
		var ip v1alpha1.IPPool
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ip)
		ps := PoolStatus{Name: p.Name, Mode: string(ip.Spec.Announce.Mode), AllocatedIPv4: ip.Status.AllocatedIPv4, AvailableIPv4: ip.Status.AvailableIPv4,
			AllocatedIPv6: ip.Status.AllocatedIPv6, AvailableIPv6: ip.Status.AvailableIPv6, Ready: "Unknown"}
		if ps.Mode == "" {
			ps.Mode = string(v1alpha1.AnnounceL2)
		}
		if c := meta.FindStatusCondition(ip.Status.Conditions, v1alpha1.PoolReady); c != nil {
			ps.Ready = string(c.Status)
			if c.Status != metav1.ConditionTrue {
				ps.Message = c.Message
			}
		}
		if c := meta.FindStatusCondition(ip.Status.Conditions, v1alpha1.PoolNodesEligible); c != nil && c.Status == metav1.ConditionFalse && ps.Message == "" {
			ps.Message = c.Message
		}
		st.Pools = append(st.Pools, ps)
	}
	set := pools.NewSet(decoded, nil)

	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	unreachable := map[string]string{} // node -> since
	for _, n := range nodes.Items {
		as := AgentStatus{Node: n.Name, Agent: "unknown"}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				as.Address = a.Address
				break
			}
		}
		for _, c := range n.Status.Conditions {
			if string(c.Type) != report.ConditionAgentReachable {
				continue
			}
			as.Agent = map[corev1.ConditionStatus]string{corev1.ConditionTrue: "reachable", corev1.ConditionFalse: "unreachable"}[c.Status]
			as.Since = c.LastTransitionTime.UTC().Format(time.RFC3339)
			if c.Status == corev1.ConditionFalse {
				unreachable[n.Name] = as.Since
			}
		}
		st.Agents = append(st.Agents, as)
	}

	// Who announces what: the CCM's ServiceAnnouncements (typed; the Announced condition says
	// the same in words, for kubectl describe, and is not read here).
	recList, err := dyn.Resource(v1alpha1.ServiceAnnouncementResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	noRecords := ""
	switch {
	case apierrors.IsNotFound(err):
		recList, noRecords = &unstructured.UnstructuredList{}, "unknown: the ServiceAnnouncement CRD is not installed (apply charts/metalvip/crds)"
	case err != nil:
		return nil, fmt.Errorf("list ServiceAnnouncements: %w", err)
	}
	records := map[string]*v1alpha1.ServiceAnnouncement{}
	for i := range recList.Items {
		var rec v1alpha1.ServiceAnnouncement
		if runtime.DefaultUnstructuredConverter.FromUnstructured(recList.Items[i].Object, &rec) == nil {
			records[rec.Namespace+"/"+rec.Name] = &rec
		}
	}
	svcs, err := client.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Services: %w", err)
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		if !serves.Ours(s) {
			continue
		}
		ss := ServiceStatus{Namespace: s.Namespace, Name: s.Name, Addresses: []string{}}
		ips := desired.StatusIPs(s)
		for _, a := range ips {
			ss.Addresses = append(ss.Addresses, a.String())
		}
		if len(ips) > 0 {
			// The pool whose ranges hold the address: the Service's allocated-pool
			// annotation is writable by whoever may edit the Service, never the answer.
			if p := set.PoolOf(ips[0]); p != nil {
				ss.Pool = p.Name
			}
		}
		if rec, ok := records[s.Namespace+"/"+s.Name]; ok && desired.RecordOf(rec, s.UID) {
			ss.Announced = rec.Addresses
			ss.AnnouncedBy = describeRecord(rec, s, unreachable)
		} else if len(ss.Addresses) > 0 {
			ss.AnnouncedBy = noRecords
		}
		if c := meta.FindStatusCondition(s.Status.Conditions, announcer.ConditionEgress); c != nil {
			ss.Egress = c.Message
			if c.Status != metav1.ConditionTrue {
				ss.Egress = c.Reason + ": " + c.Message
			}
		}
		if len(ss.Addresses) == 0 {
			// Why it waits: the allocator's Allocated condition (typed, durable), never an
			// Event (they expire).
			ss.Pending = "waiting for an address"
			if c := meta.FindStatusCondition(s.Status.Conditions, desired.ConditionAllocated); c != nil && c.Status == metav1.ConditionFalse {
				ss.Pending = c.Reason + ": " + c.Message
			}
		}
		st.Services = append(st.Services, ss)
	}
	slices.SortFunc(st.Services, func(a, b ServiceStatus) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return st, nil
}

func printTable(out io.Writer, st *Status, wide bool) {
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
	if wide {
		fmt.Fprintln(w, "SERVICE\tADDRESSES\tPOOL\tMODE\tREFUSED BY\tANNOUNCED BY")
	} else {
		fmt.Fprintln(w, "SERVICE\tADDRESSES\tPOOL\tANNOUNCED BY")
	}
	for _, s := range st.Services {
		addrs := strings.Join(s.Addresses, ",")
		by := s.AnnouncedBy
		if s.Pending != "" {
			addrs, by = "<pending>", s.Pending
		}
		if s.Egress != "" {
			by += "; egress " + s.Egress
		}
		if !wide {
			fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\n", s.Namespace, s.Name, addrs, s.Pool, by)
			continue
		}
		var modes, refused []string
		for _, a := range s.Announced {
			modes = append(modes, string(a.Mode))
			refused = append(refused, a.RefusedBy...)
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Name, addrs, s.Pool, orNone(joinUniq(modes)), orNone(joinUniq(refused)), by)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NODE\tADDRESS\tAGENT\tSINCE")
	for _, a := range st.Agents {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Node, a.Address, a.Agent, a.Since)
	}
	w.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeStatus prints st as out says: a table (or its wide form), or the Status object as JSON
// or YAML (the same fields, named as the json tags say), or through a jsonpath or go-template
// over those fields.
func writeStatus(w io.Writer, st *Status, out *printFlags) error {
	return out.print(w, st, func(w io.Writer, wide bool) { printTable(w, st, wide) })
}
