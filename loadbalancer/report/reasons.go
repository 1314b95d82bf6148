package report

// Event reasons, every one metalvip gives, in one place: metalvipctl and the docs refer to these.
const (
	// On Services, from allocation.
	ReasonIPAllocated       = "IPAllocated"
	ReasonPoolExhausted     = "PoolExhausted"
	ReasonIPInUse           = "IPInUse"
	ReasonNoPool            = "NoPool"
	ReasonSharingConflict   = "SharingConflict"
	ReasonInvalidRequest    = "InvalidRequest"
	ReasonInvalidAnnotation = "InvalidAnnotation"
	ReasonAnnotationIgnored = "AnnotationIgnored"
	ReasonIPConflict        = "IPConflict"
	ReasonPoolShrunk        = "PoolShrunk"
	// ReasonAddressReserved: a Service holds an address the cluster uses otherwise (the
	// control-plane VIP), which no pool gives and no node announces.
	ReasonAddressReserved = "AddressReserved"
	ReasonPoolDeleted     = "PoolDeleted"
	ReasonPoolInvalid     = "PoolInvalid"

	// On Services, from announcing. Who announces each address is in the Service's
	// metalvip.io/Announced condition; Events tell changes.
	ReasonMoved               = "Moved"
	ReasonNoEligibleNode      = "NoEligibleNode"
	ReasonTookOver            = "TookOver"
	ReasonAnnouncementRefused = "AnnouncementRefused"
	ReasonVIPsShareNodes      = "VIPsShareNodes"
	ReasonVIPsSpread          = "VIPsSpread"
	ReasonExternalIPRefused   = "ExternalIPRefused"
	// ReasonBGPCommunityRefused: the Service asks (metalvip.io/bgp-communities) for
	// communities its pool does not list in announce.bgp.serviceCommunities.
	ReasonBGPCommunityRefused = "BGPCommunityRefused"
	// ReasonEgressRefused: the Service asks for egress through its address and may not have it.
	ReasonEgressRefused = "EgressRefused"

	// On Nodes.
	ReasonAgentReachable   = "AgentReachable"
	ReasonAgentUnreachable = "AgentUnreachable"
	ReasonAgentVersionSkew = "AgentVersionSkew"
	// ReasonDataPlaneNotReady: the node's kube-proxy does not answer healthy (its agent's
	// --kube-proxy-healthz): the node takes no VIP until it does (ReasonDataPlaneReady).
	ReasonDataPlaneNotReady = "DataPlaneNotReady"
	ReasonDataPlaneReady    = "DataPlaneReady"
)
