// Package v1alpha1 holds metalvip's configuration objects, group metalvip.io, version
// v1alpha1: IPPool (the addresses Services get and how they are announced) and BGPPeer (the
// routers nodes advertise BGP pools to), and ServiceAnnouncement (the CCM's record of who
// announces a Service's addresses). The API server
// validates them with OpenAPI schemas and CEL rules generated from the markers here; there is
// no admission webhook.
//
// +kubebuilder:object:generate=true
// +groupName=metalvip.io
package v1alpha1
