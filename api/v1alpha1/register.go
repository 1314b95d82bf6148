package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is metalvip.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "metalvip.io", Version: "v1alpha1"}

// Resources of this package.
var (
	IPPoolResource  = GroupVersion.WithResource("ippools")
	BGPPeerResource = GroupVersion.WithResource("bgppeers")
	// ServiceAnnouncementResource is namespaced.
	ServiceAnnouncementResource = GroupVersion.WithResource("serviceannouncements")
)

var (
	// SchemeBuilder registers the types of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &IPPool{}, &IPPoolList{}, &BGPPeer{}, &BGPPeerList{}, &ServiceAnnouncement{}, &ServiceAnnouncementList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
