package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPPool is a set of addresses that Services of type LoadBalancer get their IPs from, and how
// nodes announce those IPs. Cluster-scoped.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=metalvip
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.announce.mode`
// +kubebuilder:printcolumn:name="Auto",type=boolean,JSONPath=`.spec.autoAssign`
// +kubebuilder:printcolumn:name="IPv4 used",type=integer,JSONPath=`.status.allocatedIPv4`
// +kubebuilder:printcolumn:name="IPv4 free",type=integer,JSONPath=`.status.availableIPv4`
// +kubebuilder:printcolumn:name="IPv6 used",type=integer,JSONPath=`.status.allocatedIPv6`
// +kubebuilder:printcolumn:name="IPv6 free",type=integer,JSONPath=`.status.availableIPv6`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPPoolSpec   `json:"spec"`
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolList is a list of IPPools.
//
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}

// IPPoolSpec is what an operator writes. With announce.l2.virtualMAC, no two of the pool's
// addresses may get one MAC (see VirtualMAC); the rules below say so within CEL's cost limit
// (string operations for IPv4, one IPv6 entry), and the CCM checks the same in
// loadbalancer/pools. Two pools giving one MAC are the CCM's to find (the newer is not used).
//
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.l2) && has(self.announce.l2.virtualMAC)) || self.addresses.all(a, !a.contains('/') || !a.substring(a.indexOf('/') + 1).matches('^[0-9]{1,3}$') || int(a.substring(a.indexOf('/') + 1)) >= (a.contains(':') ? (self.announce.l2.virtualMAC.scheme == 'VRRP' ? 120 : 88) : (self.announce.l2.virtualMAC.scheme == 'VRRP' ? 24 : 0)))`,message="with virtualMAC a CIDR this wide would give two addresses one MAC: with scheme VRRP give CIDRs of /24 (IPv4) or /120 (IPv6) or longer, with scheme Local IPv6 CIDRs of /88 or longer"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.l2) && has(self.announce.l2.virtualMAC) && self.announce.l2.virtualMAC.scheme == 'VRRP') || self.addresses.filter(a, !a.contains(':')).all(a, (a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).substring((a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).lastIndexOf('.') + 1) != '0' && (!a.contains('-') || (a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).substring(0, (a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).lastIndexOf('.')) == a.substring(a.indexOf('-') + 1).substring(0, a.substring(a.indexOf('-') + 1).lastIndexOf('.'))) && (a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).substring(0, (a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).lastIndexOf('.')) == (self.addresses.filter(x, !x.contains(':'))[0].contains('-') ? self.addresses.filter(x, !x.contains(':'))[0].substring(0, self.addresses.filter(x, !x.contains(':'))[0].indexOf('-')) : self.addresses.filter(x, !x.contains(':'))[0].substring(0, self.addresses.filter(x, !x.contains(':'))[0].indexOf('/'))).substring(0, (self.addresses.filter(x, !x.contains(':'))[0].contains('-') ? self.addresses.filter(x, !x.contains(':'))[0].substring(0, self.addresses.filter(x, !x.contains(':'))[0].indexOf('-')) : self.addresses.filter(x, !x.contains(':'))[0].substring(0, self.addresses.filter(x, !x.contains(':'))[0].indexOf('/'))).lastIndexOf('.')))`,message="with virtualMAC scheme VRRP an IPv4 address's last byte is its VRRP ID, 1 to 255: the pool's IPv4 addresses must lie in one /24, none ending in .0, such as 203.0.113.1-203.0.113.254"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.l2) && has(self.announce.l2.virtualMAC)) || self.addresses.all(a, !a.contains(':') || !a.contains('-') || !isIP(a.substring(0, a.indexOf('-'))) || !isIP(a.substring(a.indexOf('-') + 1)) || cidr(a.substring(0, a.indexOf('-')) + (self.announce.l2.virtualMAC.scheme == 'VRRP' ? '/120' : '/88')).containsIP(a.substring(a.indexOf('-') + 1)))`,message="with virtualMAC an IPv6 range must lie in one block: a /88 with scheme Local (the last five bytes make the MAC), a /120 with scheme VRRP (the last byte is the VRRP ID)"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.l2) && has(self.announce.l2.virtualMAC) && self.announce.l2.virtualMAC.scheme == 'VRRP') || self.addresses.all(a, !a.contains(':') || !(a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).substring((a.contains('-') ? a.substring(0, a.indexOf('-')) : a.substring(0, a.indexOf('/'))).lastIndexOf(':') + 1).matches('^(|0+|.*00|.*[.]0)$'))`,message="with virtualMAC scheme VRRP an IPv6 address's last byte is its VRRP ID, 1 to 255: the pool's IPv6 addresses must not start at one ending in 00, such as 2001:db8:100::1-2001:db8:100::ff"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.l2) && has(self.announce.l2.virtualMAC)) || self.addresses.filter(a, a.contains(':')).size() <= 1`,message="with virtualMAC give at most one IPv6 entry, a CIDR or a range (two could give two addresses one MAC)"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.bgp) && has(self.announce.bgp.aggregationLength)) || self.announce.bgp.aggregationLength == 32 || self.addresses.all(a, a.contains(':') || (!a.contains('-') && (!isCIDR(a) || cidr(a).prefixLength() <= self.announce.bgp.aggregationLength)))`,message="with aggregationLength give the pool's IPv4 addresses as CIDRs no longer than it (a /27 takes an aggregationLength of 27 to 32), not ranges, so that an aggregate covers no address outside the pool"
// +kubebuilder:validation:XValidation:rule=`!(has(self.announce) && has(self.announce.bgp) && has(self.announce.bgp.aggregationLengthV6)) || self.announce.bgp.aggregationLengthV6 == 128 || self.addresses.all(a, !a.contains(':') || (!a.contains('-') && (!isCIDR(a) || cidr(a).prefixLength() <= self.announce.bgp.aggregationLengthV6)))`,message="with aggregationLengthV6 give the pool's IPv6 addresses as CIDRs no longer than it (a /64 takes an aggregationLengthV6 of 64 to 128), not ranges, so that an aggregate covers no address outside the pool"
type IPPoolSpec struct {
	// Addresses are the pool's addresses: CIDRs and first-last ranges, IPv4 and IPv6 in one
	// pool allowed.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	Addresses []AddressRange `json:"addresses"`

	// AutoAssign: when false, the pool gives addresses only to Services that ask for it by name
	// (annotation metalvip.io/pool) or ask for one of its addresses. Default true.
	//
	// +kubebuilder:default=true
	// +optional
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// AvoidBuggyIPs skips IPv4 addresses ending in .0 or .255, which some old client stacks
	// treat as broadcast addresses.
	//
	// +optional
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`

	// Priority orders the pools a Service may get an address from when it names none: lower
	// first, pools without a priority after every pool with one, ties by name.
	//
	// +kubebuilder:validation:Minimum=0
	// +optional
	Priority *int32 `json:"priority,omitempty"`

	// ServiceAllocation limits which Services may get addresses from this pool. All the given
	// limits must hold. Unset: every Service.
	//
	// +optional
	ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`

	// ExternalIPs says whether Services may have the pool's addresses announced as their
	// spec.externalIPs. Deny (the default): an externalIP in this pool is never announced.
	// Allow: it is, for a LoadBalancer Service (which a ResourceQuota counts) that opts in
	// (annotation metalvip.io/announce-external-ips: "true", at most 16 announced) and that
	// the pool's serviceAllocation admits; the address is then announced
	// like a LoadBalancer address of the pool (mode, nodes, externalTrafficPolicy). Anyone who
	// can edit a Service can write any externalIP, so only pools that say Allow lend theirs.
	//
	// +kubebuilder:validation:Enum=Deny;Allow
	// +optional
	ExternalIPs ExternalIPsPolicy `json:"externalIPs,omitempty"`

	// Egress says whether a Service of the pool may send its pods' traffic to the outside
	// world from its address (annotation metalvip.io/egress: "true", docs/egress.md). Deny
	// (the default): never, so that no tenant takes the identity of an address the pool owner
	// did not lend for it. Allow: the node that answers for the address source-NATs the
	// Service's pods' connections to it.
	//
	// +kubebuilder:validation:Enum=Deny;Allow
	// +optional
	Egress EgressPolicy `json:"egress,omitempty"`

	// Announce says how the pool's addresses are announced. Default: mode L2 from every
	// eligible node.
	//
	// +kubebuilder:default={mode: L2}
	// +optional
	Announce Announce `json:"announce,omitempty"`
}

// AddressRange is a CIDR ("203.0.113.0/24", "2001:db8:100::/120") or an inclusive range of
// two addresses of one family ("203.0.113.10-203.0.113.20").
//
// +kubebuilder:validation:MinLength=3
// +kubebuilder:validation:MaxLength=79
// +kubebuilder:validation:XValidation:rule=`self.contains('-') ? (isIP(self.substring(0, self.indexOf('-'))) && isIP(self.substring(self.indexOf('-') + 1))) : isCIDR(self)`,message="must be a CIDR such as 203.0.113.0/24 or a range first-last such as 203.0.113.10-203.0.113.20, without spaces"
// +kubebuilder:validation:XValidation:rule=`self.contains('-') || !isCIDR(self) || cidr(self).ip() == cidr(self).masked().ip()`,message="a CIDR must not have bits set after its prefix length: write 203.0.113.0/24, not 203.0.113.7/24"
// +kubebuilder:validation:XValidation:rule=`!(self.contains('-') && isIP(self.substring(0, self.indexOf('-'))) && isIP(self.substring(self.indexOf('-') + 1))) || ip(self.substring(0, self.indexOf('-'))).family() == ip(self.substring(self.indexOf('-') + 1)).family()`,message="the two ends of a range must be of one family, both IPv4 or both IPv6"
// +kubebuilder:validation:XValidation:rule=`!(self.contains('-') && isIP(self.substring(0, self.indexOf('-'))) && isIP(self.substring(self.indexOf('-') + 1))) || ip(self.substring(0, self.indexOf('-'))).family() != ip(self.substring(self.indexOf('-') + 1)).family() || ip(self.substring(0, self.indexOf('-'))) == ip(self.substring(self.indexOf('-') + 1)) || (ip(self.substring(0, self.indexOf('-'))).family() == 4 ? [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31] : [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117,118,119,120,121,122,123,124,125,126,127]).exists(i, cidr(self.substring(0, self.indexOf('-')) + ['/0','/1','/2','/3','/4','/5','/6','/7','/8','/9','/10','/11','/12','/13','/14','/15','/16','/17','/18','/19','/20','/21','/22','/23','/24','/25','/26','/27','/28','/29','/30','/31','/32','/33','/34','/35','/36','/37','/38','/39','/40','/41','/42','/43','/44','/45','/46','/47','/48','/49','/50','/51','/52','/53','/54','/55','/56','/57','/58','/59','/60','/61','/62','/63','/64','/65','/66','/67','/68','/69','/70','/71','/72','/73','/74','/75','/76','/77','/78','/79','/80','/81','/82','/83','/84','/85','/86','/87','/88','/89','/90','/91','/92','/93','/94','/95','/96','/97','/98','/99','/100','/101','/102','/103','/104','/105','/106','/107','/108','/109','/110','/111','/112','/113','/114','/115','/116','/117','/118','/119','/120','/121','/122','/123','/124','/125','/126','/127','/128'][i]).containsIP(self.substring(self.indexOf('-') + 1)) && !cidr(self.substring(0, self.indexOf('-')) + ['/0','/1','/2','/3','/4','/5','/6','/7','/8','/9','/10','/11','/12','/13','/14','/15','/16','/17','/18','/19','/20','/21','/22','/23','/24','/25','/26','/27','/28','/29','/30','/31','/32','/33','/34','/35','/36','/37','/38','/39','/40','/41','/42','/43','/44','/45','/46','/47','/48','/49','/50','/51','/52','/53','/54','/55','/56','/57','/58','/59','/60','/61','/62','/63','/64','/65','/66','/67','/68','/69','/70','/71','/72','/73','/74','/75','/76','/77','/78','/79','/80','/81','/82','/83','/84','/85','/86','/87','/88','/89','/90','/91','/92','/93','/94','/95','/96','/97','/98','/99','/100','/101','/102','/103','/104','/105','/106','/107','/108','/109','/110','/111','/112','/113','/114','/115','/116','/117','/118','/119','/120','/121','/122','/123','/124','/125','/126','/127','/128'][i + 1]).containsIP(self.substring(self.indexOf('-') + 1)) && cidr(self.substring(0, self.indexOf('-')) + ['/0','/1','/2','/3','/4','/5','/6','/7','/8','/9','/10','/11','/12','/13','/14','/15','/16','/17','/18','/19','/20','/21','/22','/23','/24','/25','/26','/27','/28','/29','/30','/31','/32','/33','/34','/35','/36','/37','/38','/39','/40','/41','/42','/43','/44','/45','/46','/47','/48','/49','/50','/51','/52','/53','/54','/55','/56','/57','/58','/59','/60','/61','/62','/63','/64','/65','/66','/67','/68','/69','/70','/71','/72','/73','/74','/75','/76','/77','/78','/79','/80','/81','/82','/83','/84','/85','/86','/87','/88','/89','/90','/91','/92','/93','/94','/95','/96','/97','/98','/99','/100','/101','/102','/103','/104','/105','/106','/107','/108','/109','/110','/111','/112','/113','/114','/115','/116','/117','/118','/119','/120','/121','/122','/123','/124','/125','/126','/127','/128'][i + 1]).containsIP(cidr(self.substring(0, self.indexOf('-')) + ['/0','/1','/2','/3','/4','/5','/6','/7','/8','/9','/10','/11','/12','/13','/14','/15','/16','/17','/18','/19','/20','/21','/22','/23','/24','/25','/26','/27','/28','/29','/30','/31','/32','/33','/34','/35','/36','/37','/38','/39','/40','/41','/42','/43','/44','/45','/46','/47','/48','/49','/50','/51','/52','/53','/54','/55','/56','/57','/58','/59','/60','/61','/62','/63','/64','/65','/66','/67','/68','/69','/70','/71','/72','/73','/74','/75','/76','/77','/78','/79','/80','/81','/82','/83','/84','/85','/86','/87','/88','/89','/90','/91','/92','/93','/94','/95','/96','/97','/98','/99','/100','/101','/102','/103','/104','/105','/106','/107','/108','/109','/110','/111','/112','/113','/114','/115','/116','/117','/118','/119','/120','/121','/122','/123','/124','/125','/126','/127','/128'][i]).masked().ip()))`,message="the range is reversed: write the lower address first, as in 203.0.113.10-203.0.113.20"
type AddressRange string

// ServiceAllocation limits the Services a pool serves.
type ServiceAllocation struct {
	// Namespaces the Service must be in. Empty: any.
	//
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector the Service's namespace must match.
	//
	// +optional
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`

	// ServiceSelector the Service must match.
	//
	// +optional
	ServiceSelector *LabelSelector `json:"serviceSelector,omitempty"`
}

// ExternalIPsPolicy says whether a pool's addresses may be announced as Services' externalIPs.
type ExternalIPsPolicy string

// ExternalIPs policies.
const (
	ExternalIPsDeny  ExternalIPsPolicy = "Deny"
	ExternalIPsAllow ExternalIPsPolicy = "Allow"
)

// EgressPolicy says whether a pool's addresses may be the source of Services' egress traffic.
type EgressPolicy string

// Egress policies.
const (
	EgressDeny  EgressPolicy = "Deny"
	EgressAllow EgressPolicy = "Allow"
)

// AnnounceMode is how a pool's addresses reach the network.
//
// +kubebuilder:validation:Enum=L2;BGP
type AnnounceMode string

const (
	// AnnounceL2 answers ARP (IPv4) and NDP (IPv6) for the address on the nodes' segment.
	AnnounceL2 AnnounceMode = "L2"
	// AnnounceBGP advertises the address as a /32 or /128 to BGP peers.
	AnnounceBGP AnnounceMode = "BGP"
)

// Announce says how and from which nodes a pool's addresses are announced.
//
// +kubebuilder:validation:XValidation:rule="!has(self.l2) || self.mode == 'L2'",message="l2 options apply only to mode L2; remove l2 or set mode: L2"
// +kubebuilder:validation:XValidation:rule="!has(self.bgp) || self.mode == 'BGP'",message="bgp options apply only to mode BGP; remove bgp or set mode: BGP"
type Announce struct {
	// Mode is L2 (ARP/NDP on the segment) or BGP. Default L2.
	//
	// +kubebuilder:default=L2
	// +optional
	Mode AnnounceMode `json:"mode,omitempty"`

	// NodeSelector picks the nodes that may announce the pool's addresses. Unset: every node.
	//
	// +optional
	NodeSelector *LabelSelector `json:"nodeSelector,omitempty"`

	// PreferredNodeSelector picks nodes that win ties when L2 addresses are spread over the
	// nodes (a pool of nodes for high-traffic Services). Balance still comes first.
	//
	// +optional
	PreferredNodeSelector *LabelSelector `json:"preferredNodeSelector,omitempty"`

	// L2 options; only with mode L2.
	//
	// +optional
	L2 *L2Announce `json:"l2,omitempty"`

	// BGP options; only with mode BGP.
	//
	// +optional
	BGP *BGPAnnounce `json:"bgp,omitempty"`
}

// L2Announce holds the options of mode L2.
//
// +kubebuilder:validation:XValidation:rule="!has(self.virtualMAC) || !has(self.spreading) || self.spreading != 'PerClient'",message="virtualMAC gives each address one MAC, which one node holds at a time; spreading PerClient answers from several nodes at once: use one or the other"
type L2Announce struct {
	// Interfaces the agents answer ARP and NDP on. Empty: each agent's own --interfaces, by
	// default the interface of its node's default route.
	//
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self.all(i, i.matches('^[!-.0-9;-~]{1,15}$') && i != '.' && i != '..')",message="an interface name is 1 to 15 ASCII characters without '/', ':' or spaces, and not . or .., such as eth0 or bond0.100"
	// +listType=set
	// +optional
	Interfaces []string `json:"interfaces,omitempty"`

	// Spreading says how a VIP's on-link clients spread over nodes. Single: the first live
	// candidate answers every client. PerClient: every live candidate answers, each for its
	// share of clients (a hash of the client's address), so one VIP's traffic from the
	// segment enters through several nodes; when a candidate dies or returns, only its
	// clients move, each told at once. Clients behind a router all look like the router to
	// ARP and NDP: use mode BGP for them.
	//
	// +kubebuilder:validation:Enum=Single;PerClient
	// +kubebuilder:default=Single
	// +optional
	Spreading L2Spreading `json:"spreading,omitempty"`

	// VirtualMAC, when set, answers each address of the pool with a MAC of its own, derived
	// from the address, which moves with it from node to node: a client's neighbour entry
	// stays right across a failover, and only the switch learns a new port, from the new
	// owner's first frame. For clients that ignore gratuitous ARP (appliances, firewalls,
	// some switches). Not with spreading PerClient. The switch side must let a MAC move
	// between ports (port security, hypervisors' MAC spoof checks): see docs/announcing.md.
	//
	// +optional
	VirtualMAC *VirtualMAC `json:"virtualMAC,omitempty"`
}

// VirtualMAC says which MACs a pool's addresses get.
type VirtualMAC struct {
	// Scheme is Local or VRRP. Local (the default): locally administered MACs, 02:00 and
	// the four bytes of an IPv4 address (203.0.113.5 is 02:00:cb:00:71:05), 06 and the last
	// five bytes of an IPv6 address (2001:db8::5 is 06:00:00:00:00:05); a pool's IPv6
	// addresses lie in one /88. VRRP: the MACs of VRRP (RFC 5798), 00:00:5e:00:01:ID for
	// IPv4 and 00:00:5e:00:02:ID for IPv6, where the ID is the address's last byte, 1 to
	// 255; a pool's addresses of a family lie in one /24 (IPv4) or /120 (IPv6). With VRRP,
	// choose the addresses so that their IDs are not those of a VRRP router on the segment.
	// Two pools that would give two addresses one MAC: the newer one is not used.
	//
	// +kubebuilder:validation:Enum=Local;VRRP
	// +kubebuilder:default=Local
	// +optional
	Scheme VirtualMACScheme `json:"scheme,omitempty"`
}

// VirtualMACScheme is how an address's MAC is made.
type VirtualMACScheme string

// Schemes of virtual MACs.
const (
	VirtualMACLocal VirtualMACScheme = "Local"
	VirtualMACVRRP  VirtualMACScheme = "VRRP"
)

// L2Spreading is how an L2 VIP's clients spread over nodes.
type L2Spreading string

// Spreadings.
const (
	SpreadSingle    L2Spreading = "Single"
	SpreadPerClient L2Spreading = "PerClient"
)

// BGPAnnounce holds the options of mode BGP.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.weightByEndpoints) && self.weightByEndpoints && ((has(self.aggregationLength) && self.aggregationLength != 32) || (has(self.aggregationLengthV6) && self.aggregationLengthV6 != 128)))",message="an aggregate route carries several addresses and so no one Service's endpoints: turn weightByEndpoints or the aggregation off"
// +kubebuilder:validation:XValidation:rule="!(has(self.serviceCommunities) && size(self.serviceCommunities) > 0 && ((has(self.aggregationLength) && self.aggregationLength != 32) || (has(self.aggregationLengthV6) && self.aggregationLengthV6 != 128)))",message="an aggregate route carries several Services' addresses and so no one Service's communities: remove serviceCommunities or the aggregation"
type BGPAnnounce struct {
	// Communities attached to the pool's routes, each "ASN:value", two numbers from 0 to
	// 65535 (RFC 1997), such as 64496:100.
	//
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=11
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,5}:[0-9]{1,5}$`
	// +kubebuilder:validation:XValidation:rule="self.all(c, !c.matches('^[0-9]{1,5}:[0-9]{1,5}$') || (int(c.substring(0, c.indexOf(':'))) <= 65535 && int(c.substring(c.indexOf(':') + 1)) <= 65535))",message="each half of a community is a number from 0 to 65535: write ASN:value such as 64496:100"
	// +listType=set
	// +optional
	Communities []string `json:"communities,omitempty"`

	// LargeCommunities attached to the pool's routes (RFC 8092), each "ASN:value1:value2",
	// three numbers from 0 to 4294967295, such as 4200000000:1:2 (MetalLB's "large:..."
	// communities).
	//
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$`
	// +kubebuilder:validation:XValidation:rule="self.all(c, !c.matches('^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$') || c.split(':').all(p, uint(p) <= 4294967295u))",message="each part of a large community is a number from 0 to 4294967295: write ASN:value1:value2 such as 4200000000:1:2"
	// +listType=set
	// +optional
	LargeCommunities []string `json:"largeCommunities,omitempty"`

	// ServiceCommunities are the communities a Service of this pool may add to its own
	// routes with the annotation metalvip.io/bgp-communities (comma-separated, such as
	// "64496:200,64496:300"), on top of communities. A Service that asks for one not listed
	// gets the listed ones it asked for and a Warning Event (BGPCommunityRefused) naming the
	// others. Default none: the annotation is refused. Not with aggregationLength or
	// aggregationLengthV6 (an aggregate carries several Services' addresses).
	//
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=11
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,5}:[0-9]{1,5}$`
	// +kubebuilder:validation:XValidation:rule="self.all(c, !c.matches('^[0-9]{1,5}:[0-9]{1,5}$') || (int(c.substring(0, c.indexOf(':'))) <= 65535 && int(c.substring(c.indexOf(':') + 1)) <= 65535))",message="each half of a community is a number from 0 to 65535: write ASN:value such as 64496:100"
	// +listType=set
	// +optional
	ServiceCommunities []string `json:"serviceCommunities,omitempty"`

	// LocalPref attached to the pool's routes (iBGP peers only): 0 to 4294967295, a 32-bit
	// number.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +optional
	LocalPref *int64 `json:"localPref,omitempty"`

	// AggregationLength announces the pool's IPv4 addresses as routes of this prefix length
	// instead of one /32 each (MetalLB's aggregationLength): a node advertises the aggregate
	// that holds an address it announces, once however many of its addresses it holds. Every
	// address range of the pool must be whole blocks of this length, so that an aggregate
	// never covers an address outside the pool: CIDRs no longer than it, no ranges.
	// Routers then send traffic for the pool's free
	// addresses to the nodes too, which drop it, and with externalTrafficPolicy Local a node
	// serving one address of an aggregate draws the traffic of all of them. Default 32.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	// +optional
	AggregationLength *int32 `json:"aggregationLength,omitempty"`

	// AggregationLengthV6 is AggregationLength for the pool's IPv6 addresses. Default 128.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=128
	// +optional
	AggregationLengthV6 *int32 `json:"aggregationLengthV6,omitempty"`

	// WeightByEndpoints weights each node's route by the ready endpoints it runs, for
	// Services with externalTrafficPolicy Local: the route carries the link-bandwidth
	// extended community (draft-ietf-idr-link-bandwidth, 1 Mbit/s per endpoint), so a router
	// with weighted ECMP (FRR: bgp bestpath bandwidth) gives a node with three endpoints three
	// times the traffic of a node with one. Routes of Cluster-policy Services carry none
	// (every node forwards to every endpoint). Off: equal shares, as without it.
	//
	// +optional
	WeightByEndpoints bool `json:"weightByEndpoints,omitempty"`

	// Drain is how a node being drained (cordoned, or carrying the drain label) moves the
	// pool's traffic away during the drain delay, before it withdraws its routes.
	// GracefulShutdown (the default) adds the GRACEFUL_SHUTDOWN community (65535:0, RFC 8326):
	// a router that honours it stops using the node's path at once, which any router
	// understands but, on a router with plain hash-based ECMP, moves established
	// connections (the node's and some of the others'), which then reset. Weight keeps the
	// path and lowers its link bandwidth to the least a router can tell apart from none
	// (every node of the pool advertises a link bandwidth, 1 Mbit/s per endpoint or 1 Mbit/s
	// without weightByEndpoints): a router with weighted ECMP over resilient next-hop
	// groups (Linux resilient nexthop groups, vendors' resilient or consistent hashing)
	// moves only idle flows off the node, so new connections leave it and established ones
	// stay until the withdrawal. Weight needs the router to use the link-bandwidth community;
	// see docs/announcing.md (Drains).
	//
	// +kubebuilder:validation:Enum=GracefulShutdown;Weight
	// +optional
	Drain DrainMode `json:"drain,omitempty"`
}

// DrainMode is how a drained node's BGP routes move traffic away before their withdrawal.
type DrainMode string

// Drain modes.
const (
	DrainGracefulShutdown DrainMode = "GracefulShutdown"
	DrainWeight           DrainMode = "Weight"
)

// IPPoolStatus is what the controller reports.
type IPPoolStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	//
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// AllocatedIPv4 and AllocatedIPv6 count the pool's addresses held by Services.
	//
	// +optional
	AllocatedIPv4 int64 `json:"allocatedIPv4"`
	// +optional
	AllocatedIPv6 int64 `json:"allocatedIPv6"`

	// AvailableIPv4 and AvailableIPv6 count the pool's free addresses (after avoidBuggyIPs).
	// Counts above 2^63-1 (large IPv6 ranges) are reported as 2^63-1.
	//
	// +optional
	AvailableIPv4 int64 `json:"availableIPv4"`
	// +optional
	AvailableIPv6 int64 `json:"availableIPv6"`

	// Conditions: Ready (the pool gives out addresses), Overlaps (it shares addresses with
	// another pool), AddressesInUseRemoved (addresses removed from the spec are still held by
	// Services, which keep them), NodesEligible (some node may announce its addresses; False
	// names the cause), AgentsAccept (no agent refused one of its announcements).
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types of IPPool.
const (
	PoolReady                 = "Ready"
	PoolOverlaps              = "Overlaps"
	PoolAddressesInUseRemoved = "AddressesInUseRemoved"
	PoolNodesEligible         = "NodesEligible"
	PoolAgentsAccept          = "AgentsAccept"
)
