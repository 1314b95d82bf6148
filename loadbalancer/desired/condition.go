package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/planner"
)

// ConditionAnnounced is the type of the Service condition that says which nodes announce
// each of its addresses, in what mode. It is durable (Events expire after an hour) and
// written only when it changes.
const ConditionAnnounced = "metalvip.io/Announced"

// ConditionAllocated is the type of the Service condition that says why it has no address
// yet: False, with the reason and message of the Warning Event that said so. The allocator sets it when an allocation fails and removes it once
// the Service has its addresses; a Service that never waited has none.
const ConditionAllocated = "metalvip.io/Allocated"

// Reasons of the Announced condition.
const (
	// ReasonAnnounced: every address has a node announcing it.
	ReasonAnnounced = "Announced"
	// ReasonNoEligibleNode: some address has no node that may announce it.
	ReasonNoEligibleNode = "NoEligibleNode"
	// ReasonRefusedByAgent: an agent refused an address's announcement (see the Service's
	// Events and the pool's conditions for the field at fault).
	ReasonRefusedByAgent = "RefusedByAgent"
)

// Modes as the condition writes them.
const (
	ModeL2          = "L2"
	ModeL2PerClient = "L2 per client"
	ModeBGP         = "BGP"
)

// Address is who announces one address of a Service.
type Address struct {
	Addr netip.Addr
	Mode string // ModeL2, ModeL2PerClient or ModeBGP
	// Nodes: in mode L2 the first answers and the others stand by, in order; in the other
	// modes every node answers (or advertises). Empty: no node may announce it.
	Nodes []string
	// RefusedBy names the nodes whose agents refused the announcement.
	RefusedBy []string
}

// AddressOf describes one address from its plan entry.
func AddressOf(addr netip.Addr, e planner.Entry, perClient bool, refusedBy []string) Address {
	a := Address{Addr: addr, Mode: ModeL2, Nodes: slices.Clone(e.Nodes), RefusedBy: slices.Sorted(slices.Values(refusedBy))}
	switch {
	case e.Mode == planner.BGP:
		a.Mode = ModeBGP
	case perClient:
		a.Mode = ModeL2PerClient
		slices.Sort(a.Nodes)
	}
	return a
}

// Condition is the Announced condition for a Service's addresses (sorted by the caller as its
// status lists them). The caller sets LastTransitionTime.
func Condition(addrs []Address, generation int64) metav1.Condition {
	c := metav1.Condition{Type: ConditionAnnounced, Status: metav1.ConditionTrue, Reason: ReasonAnnounced, ObservedGeneration: generation}
	for _, a := range addrs {
		if len(a.RefusedBy) > 0 {
			c.Status, c.Reason = metav1.ConditionFalse, ReasonRefusedByAgent
		}
		if len(a.Nodes) == 0 && c.Reason != ReasonRefusedByAgent {
			c.Status, c.Reason = metav1.ConditionFalse, ReasonNoEligibleNode
		}
	}
	c.Message = FormatAddresses(addrs)
	return c
}

// FormatAddresses writes addresses as the condition's message, one clause per address:
//
//	203.0.113.1 (L2): node1, standby node2, node3; 203.0.113.9 (BGP): node1, node2
//
// It is for people; programs read the ServiceAnnouncement (Record).
func FormatAddresses(addrs []Address) string {
	parts := make([]string, 0, len(addrs))
	for _, a := range addrs {
		var who string
		switch {
		case len(a.Nodes) == 0:
			who = "no eligible node"
		case a.Mode == ModeL2 && len(a.Nodes) > 1:
			who = a.Nodes[0] + ", standby " + strings.Join(a.Nodes[1:], ", ")
		default:
			who = strings.Join(a.Nodes, ", ")
		}
		if len(a.RefusedBy) > 0 {
			who += ", refused by " + strings.Join(a.RefusedBy, " and ")
		}
		parts = append(parts, fmt.Sprintf("%s (%s): %s", a.Addr, a.Mode, who))
	}
	return strings.Join(parts, "; ")
}

// Record is what a Service's ServiceAnnouncement says of its addresses: the typed twin of
// the condition's message, which is for people (kubectl describe) and is never parsed.
func Record(addrs []Address) []v1alpha1.AnnouncedAddress {
	out := make([]v1alpha1.AnnouncedAddress, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, v1alpha1.AnnouncedAddress{Address: a.Addr.String(), Mode: recordModes[a.Mode],
			Nodes: slices.Clone(a.Nodes), RefusedBy: slices.Clone(a.RefusedBy)})
	}
	return out
}

// FromRecord reads what Record wrote; an address it cannot read is an error.
func FromRecord(rec []v1alpha1.AnnouncedAddress) ([]Address, error) {
	out := make([]Address, 0, len(rec))
	for _, r := range rec {
		addr, err := netip.ParseAddr(r.Address)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", r.Address, err)
		}
		mode, ok := conditionModes[r.Mode]
		if !ok {
			return nil, fmt.Errorf("address %s: mode %q", addr, r.Mode)
		}
		out = append(out, Address{Addr: addr, Mode: mode, Nodes: slices.Clone(r.Nodes), RefusedBy: slices.Clone(r.RefusedBy)})
	}
	return out, nil
}

// RecordOf reports whether rec is the record of the Service of uid (its controller), and not
// one left by an earlier Service of the same name.
func RecordOf(rec *v1alpha1.ServiceAnnouncement, uid types.UID) bool {
	return slices.ContainsFunc(rec.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "Service" && o.UID == uid && o.Controller != nil && *o.Controller
	})
}

var (
	recordModes    = map[string]v1alpha1.AnnounceKind{ModeL2: v1alpha1.AnnouncedL2, ModeL2PerClient: v1alpha1.AnnouncedL2PerClient, ModeBGP: v1alpha1.AnnouncedBGP}
	conditionModes = map[v1alpha1.AnnounceKind]string{v1alpha1.AnnouncedL2: ModeL2, v1alpha1.AnnouncedL2PerClient: ModeL2PerClient, v1alpha1.AnnouncedBGP: ModeBGP}
)
