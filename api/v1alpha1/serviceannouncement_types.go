package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceAnnouncement says which nodes announce each address of the LoadBalancer Service of
// the same namespace and name, as the CCM planned it: the record `metalvipctl status` reads.
// Only the CCM writes it (no role that Kubernetes aggregates into admin or edit may write
// it; metalvip:announcement-viewer, aggregated into view, may read it), and an owner
// reference to the Service deletes it with the Service. Like an EndpointSlice it has no spec:
// it is a record, written whole.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=metalvip,shortName=svcann
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.addresses[*].address`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.addresses[*].nodes`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ServiceAnnouncement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// ObservedGeneration is the Service's generation the CCM planned from: lower than the
	// Service's means the CCM has not seen its latest spec.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Addresses: each of the Service's addresses (in the order of its status) with who
	// announces it.
	//
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Addresses []AnnouncedAddress `json:"addresses"`
}

// AnnounceKind is how an address is announced.
//
// +kubebuilder:validation:Enum=L2;L2PerClient;BGP
type AnnounceKind string

// Kinds of announcement.
const (
	// AnnouncedL2: one node answers ARP/NDP for the address, the others stand by in order.
	AnnouncedL2 AnnounceKind = "L2"
	// AnnouncedL2PerClient: every listed node answers a share of the clients.
	AnnouncedL2PerClient AnnounceKind = "L2PerClient"
	// AnnouncedBGP: every listed node advertises the address (an ECMP set).
	AnnouncedBGP AnnounceKind = "BGP"
)

// AnnouncedAddress is who announces one address.
type AnnouncedAddress struct {
	// Address is the IP address.
	//
	// +kubebuilder:validation:MaxLength=45
	Address string `json:"address"`
	// Mode is how it is announced.
	Mode AnnounceKind `json:"mode"`
	// Nodes announce it: in mode L2 the first answers and the others stand by, in order; in
	// the other modes every node answers (or advertises). Empty: no node may announce it.
	//
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	Nodes []string `json:"nodes,omitempty"`
	// RefusedBy names the nodes whose agents refused the announcement (the Service's Events
	// and the pool's conditions say why).
	//
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	RefusedBy []string `json:"refusedBy,omitempty"`
}

// ServiceAnnouncementList is a list of ServiceAnnouncements.
//
// +kubebuilder:object:root=true
type ServiceAnnouncementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceAnnouncement `json:"items"`
}
