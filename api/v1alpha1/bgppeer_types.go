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
// +kubebuilder:printcolumn:name="Interface",type=string,JSONPath=`.spec.interface`,priority=1
// +kubebuilder:printcolumn:name="Peer ASN",type=integer,JSONPath=`.spec.peerASN`
// +kubebuilder:printcolumn:name="My ASN",type=integer,JSONPath=`.spec.myASN`
// +kubebuilder:printcolumn:name="BFD",type=boolean,JSONPath=`.spec.bfd.enabled`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Sessions",type=string,JSONPath=`.status.sessions`
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

	// Sessions sums up the nodes' sessions, such as "Established 3/3": how many of the
	// nodes this peer selects have their session established.
	//
	// +optional
	Sessions string `json:"sessions,omitempty"`

	// Nodes are the sessions, one per node this peer selects, as the nodes' agents report
	// them.
	//
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=5000
	// +optional
	Nodes []BGPPeerNodeStatus `json:"nodes,omitempty"`
}

// BGPPeerNodeStatus is one node's session with the peer.
type BGPPeerNodeStatus struct {
	// Node is the node's name.
	Node string `json:"node"`
	// State is the BGP state: Idle, Connect, Active, OpenSent, OpenConfirm or Established;
	// Unknown when the CCM does not reach the node's agent, NotConfigured when the agent
	// runs no session with the peer (its state is not applied yet, or it refused the peer).
	State string `json:"state"`
	// BFDState is Up, Down, Init or AdminDown; empty without BFD.
	//
	// +optional
	BFDState string `json:"bfdState,omitempty"`
	// RoutesAdvertised is how many routes the node sends the peer.
	//
	// +optional
	RoutesAdvertised int32 `json:"routesAdvertised,omitempty"`
	// LastError says why the session last went down or failed to come up.
	//
	// +optional
	LastError string `json:"lastError,omitempty"`
	// Since is when State last changed, as the agent saw it.
	//
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
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
// +kubebuilder:validation:XValidation:rule="has(self.address) != has(self.interface)",message="give the router's address, or the interface of an unnumbered session, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.interface) || (!has(self.sourceAddress) && (!has(self.ebgpMultihop) || self.ebgpMultihop <= 1))",message="an unnumbered session (interface) runs from the node's link-local address to the router on the link: remove sourceAddress and ebgpMultihop"
// +kubebuilder:validation:XValidation:rule="!has(self.bfd) || !self.bfd.enabled || !has(self.ebgpMultihop) || self.ebgpMultihop <= 1",message="BFD here is single-hop: turn bfd off or remove ebgpMultihop"
// +kubebuilder:validation:XValidation:rule="!has(self.sourceAddress) || !has(self.address) || !isIP(self.sourceAddress) || !isIP(self.address) || ip(self.sourceAddress).family() == ip(self.address).family()",message="sourceAddress must be of the address family of address"
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveSeconds) || !has(self.holdTimeSeconds) || self.holdTimeSeconds == 0 || self.keepaliveSeconds * 3 <= self.holdTimeSeconds",message="keepaliveSeconds must be at most a third of holdTimeSeconds, such as holdTimeSeconds: 90 with keepaliveSeconds: 30"
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveSeconds) || self.keepaliveSeconds == 0 || !has(self.holdTimeSeconds) || self.holdTimeSeconds != 0",message="holdTimeSeconds 0 takes no keepaliveSeconds: remove keepaliveSeconds, or set holdTimeSeconds to at least three times it"
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveSeconds) || has(self.holdTimeSeconds) || self.keepaliveSeconds <= 30",message="keepaliveSeconds must be at most a third of the hold time, 90 by default: give at most 30, or set holdTimeSeconds to at least three times it"
type BGPPeerSpec struct {
	// Address is the router's unicast address, IPv4 or IPv6; not unspecified, loopback,
	// link-local, multicast or broadcast (255.0.0.0/8). Give address or interface.
	//
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address such as 198.51.100.1"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || !ip(self).isUnspecified()",message="0.0.0.0 and :: name no router: give the router's own address, such as 198.51.100.1"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || !ip(self).isLoopback()",message="a loopback address is the node itself, not a router: give the router's address on the node network, such as 198.51.100.1"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || !ip(self).isLinkLocalUnicast()",message="a link-local address (169.254.0.0/16, fe80::/10) is the router's on one link only: for BGP unnumbered give interface instead of address, else a global or unique-local address of the router"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || (ip(self).isGlobalUnicast() && !self.startsWith('255.')) || ip(self).isUnspecified() || ip(self).isLoopback() || ip(self).isLinkLocalUnicast()",message="a multicast or broadcast address (224.0.0.0/4, 255.0.0.0/8, ff00::/8) names no router: give the router's unicast address, such as 198.51.100.1"
	// +optional
	Address string `json:"address,omitempty"`

	// Interface makes the session unnumbered ("BGP unnumbered", RFC 8950): each node peers
	// with the one IPv6 link-local neighbour of its interface of this name, a point-to-point
	// link to the router, and the session carries IPv4 VIPs (with an IPv6 next hop) and IPv6
	// VIPs. The node sends Router Advertisements with a lifetime of 0 on the link (so the
	// router learns its address, as FRR's "neighbor IF interface" needs) and solicits the
	// router's. Nodes without the interface report the session down with the reason. Give
	// address or interface; not with sourceAddress or ebgpMultihop. MetalLB's interface.
	//
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self.matches('^[!-.0-9;-~]{1,15}$') && self != '.' && self != '..'",message="an interface name is 1 to 15 ASCII characters without '/', ':' or spaces, and not . or .., such as eth1"
	// +optional
	Interface string `json:"interface,omitempty"`

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
	NodeSelector *LabelSelector `json:"nodeSelector,omitempty"`

	// HoldTimeSeconds proposed in OPEN: 0, or 3 and more. Default 90.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="self == 0 || self >= 3",message="must be 0 or at least 3"
	// +optional
	HoldTimeSeconds *int32 `json:"holdTimeSeconds,omitempty"`

	// KeepaliveSeconds between KEEPALIVEs: at most a third of the hold time (of 90 when
	// holdTimeSeconds is not given), none with hold time 0. Default a third of the hold time.
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

	// SourceAddress is the local address the nodes open the session from, of the address
	// family of address. It must be an address the node holds, so it suits a BGPPeer whose
	// nodeSelector selects one node (MetalLB's sourceAddress); a node that does not hold it
	// refuses the peer and says so (the Accepted condition, RefusedByAgent). Default: the kernel's choice
	// by the route to the router.
	//
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address such as 198.51.100.11"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip(self).isGlobalUnicast()",message="must be a unicast address of a node (not unspecified, loopback, link-local or multicast), such as 198.51.100.11"
	// +optional
	SourceAddress string `json:"sourceAddress,omitempty"`

	// ConnectRetrySeconds is how long a node waits before it dials the router again after a
	// failed attempt (RFC 4271's ConnectRetryTime; MetalLB's connectTime). Default 5.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	ConnectRetrySeconds *int32 `json:"connectRetrySeconds,omitempty"`

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

	// TTLSecurity turns on GTSM (RFC 5082): the nodes send to the router with TTL 255 and
	// accept only packets that arrive with TTL 255, so a host farther away than the router
	// cannot reach the session even with a forged source address. With ebgpMultihop N the
	// router may be N hops away: packets must arrive with TTL 256-N or more. The router must
	// turn it on too (FRR: neighbor X ttl-security hops 1).
	//
	// +optional
	TTLSecurity bool `json:"ttlSecurity,omitempty"`

	// ServiceCIDRs are the cluster's ClusterIP ranges (the kube-apiserver's
	// --service-cluster-ip-range, which the CCM cannot read), such as ["10.96.0.0/16"].
	// Every eligible node this peer selects advertises each as one aggregate, with itself as
	// the next hop, so that hosts behind the router reach ClusterIPs (kube-proxy on any node
	// serves every ClusterIP). Note: a node advertises them on all of its sessions.
	//
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self.all(c, isCIDR(c))",message="each must be a CIDR such as 10.96.0.0/16 or fd00:10:96::/112"
	// +kubebuilder:validation:XValidation:rule="self.all(c, !isCIDR(c) || cidr(c).ip() == cidr(c).masked().ip())",message="a CIDR must not have bits set after its prefix length: write 10.96.0.0/16, not 10.96.0.1/16"
	// +kubebuilder:validation:XValidation:rule="self.all(c, !isCIDR(c) || cidr(c).prefixLength() >= (cidr(c).ip().family() == 4 ? 8 : 48))",message="a ClusterIP range is at most a /8 (IPv4) or a /48 (IPv6): a wider one would draw traffic that is not the cluster's"
	// +listType=set
	// +optional
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
}

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	// Namespace of the Secret.
	//
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="must be a namespace name: lower-case letters, digits and '-', such as kube-system"
	Namespace string `json:"namespace"`
	// Name of the Secret.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a Secret name: lower-case letters, digits, '-' and '.', such as bgp-password"
	Name string `json:"name"`
	// Key in the Secret's data.
	//
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$')",message="must be a Secret key: letters, digits, '-', '_' and '.', such as password"
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
