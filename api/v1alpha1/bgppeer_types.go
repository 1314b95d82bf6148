package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BGPPeer is a router that nodes open BGP sessions to, to advertise the VIPs of BGP pools.
// Cluster-scoped.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=metalvip
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Peer ASN",type=integer,JSONPath=`.spec.peerASN`
// +kubebuilder:printcolumn:name="My ASN",type=integer,JSONPath=`.spec.myASN`
// +kubebuilder:printcolumn:name="BFD",type=boolean,JSONPath=`.spec.bfd.enabled`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPPeerSpec   `json:"spec"`
	Status BGPPeerStatus `json:"status,omitempty"`
}

// BGPPeerStatus is what the controller reports.
type BGPPeerStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Accepted (the sessions run on the nodes the peer selects; False says why
	// not: an invalid field, a password that cannot be read, an address another peer has on
	// the same nodes, or an agent's refusal).
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types of BGPPeer.
const (
	PeerAccepted = "Accepted"
)

// BGPPeerList is a list of BGPPeers.
//
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPPeer `json:"items"`
}

// BGPPeerSpec describes the session.
//
// +kubebuilder:validation:XValidation:rule="!has(self.bfd) || !self.bfd.enabled || !has(self.ebgpMultihop) || self.ebgpMultihop <= 1",message="BFD here is single-hop: turn bfd off or remove ebgpMultihop"
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveSeconds) || !has(self.holdTimeSeconds) || self.keepaliveSeconds * 3 <= self.holdTimeSeconds",message="keepaliveSeconds must be at most a third of holdTimeSeconds"
type BGPPeerSpec struct {
	// Address is the router's address, IPv4 or IPv6.
	//
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address such as 198.51.100.1"
	Address string `json:"address"`

	// Port is the router's BGP port. Default 179.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port *int32 `json:"port,omitempty"`

	// PeerASN is the router's AS number.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	PeerASN int64 `json:"peerASN"`

	// MyASN is the nodes' AS number in this session.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	MyASN int64 `json:"myASN"`

	// NodeSelector picks the nodes that peer with this router. Unset: every node.
	//
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// HoldTimeSeconds proposed in OPEN: 0, or 3 and more. Default 90.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self == 0 || self >= 3",message="must be 0 or at least 3"
	// +optional
	HoldTimeSeconds *int32 `json:"holdTimeSeconds,omitempty"`

	// KeepaliveSeconds between KEEPALIVEs. Default a third of the hold time.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=21845
	// +optional
	KeepaliveSeconds *int32 `json:"keepaliveSeconds,omitempty"`

	// EBGPMultihop allows a router that many hops away. Default 1 (directly connected).
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	// +optional
	EBGPMultihop *int32 `json:"ebgpMultihop,omitempty"`

	// PasswordSecretRef names a Secret key holding the TCP MD5 password.
	//
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`

	// BFD turns on fast failure detection for the session.
	//
	// +optional
	BFD *BFDSettings `json:"bfd,omitempty"`

	// GracefulRestart advertises the graceful restart capability, so that the router keeps a
	// node's routes while its agent restarts.
	//
	// +optional
	GracefulRestart bool `json:"gracefulRestart,omitempty"`
}

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	// +kubebuilder:validation:MaxLength=253
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// BFDSettings are the BFD timers of a session.
type BFDSettings struct {
	// Enabled turns BFD on.
	Enabled bool `json:"enabled"`

	// MinRxMilliseconds, MinTxMilliseconds: the slowest receive and transmit intervals wanted.
	// Default 300.
	//
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=60000
	// +optional
	MinRxMilliseconds *int32 `json:"minRxMilliseconds,omitempty"`
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=60000
	// +optional
	MinTxMilliseconds *int32 `json:"minTxMilliseconds,omitempty"`

	// Multiplier: missed packets before the session is down. Default 3.
	//
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=255
	// +optional
	Multiplier *int32 `json:"multiplier,omitempty"`
}
