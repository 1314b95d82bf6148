package provider

import (
	"context"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/metalvip/metalvip/provider/config"
)

func mustConfig(t *testing.T, s string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInstanceMetadata(t *testing.T) {
	cfg := mustConfig(t, `
topology:
  zoneLabel: example.com/rack
  subnets:
  - {cidr: 198.51.100.0/24, zone: z-wide, region: r1}
  - {cidr: 198.51.100.0/28, zone: z-narrow, region: r1}
  - {cidr: "2001:db8::/32", zone: z-v6, region: r6}
instanceTypeLabel: example.com/hw
`)
	taint := v1.Taint{Key: cloudproviderapi.TaintExternalCloudProvider, Effect: v1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name      string
		node      v1.Node
		wantNil   bool
		wantID    string
		wantAddrs []v1.NodeAddress
		wantZone  string
		wantReg   string
		wantType  string
	}{
		{
			name: "a node with a provided IP gets it first, then the reported addresses, and the narrowest subnet's zone",
			node: v1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"example.com/hw": "r640"},
					Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "198.51.100.5"}},
				Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
					{Type: v1.NodeHostName, Address: "n1"},
					{Type: v1.NodeInternalIP, Address: "198.51.100.5"},
					{Type: v1.NodeInternalIP, Address: "10.0.0.1"},
				}},
			},
			wantID: "metalvip://n1",
			wantAddrs: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "198.51.100.5"},
				{Type: v1.NodeHostName, Address: "n1"},
				{Type: v1.NodeInternalIP, Address: "10.0.0.1"},
			},
			wantZone: "z-narrow", wantReg: "r1", wantType: "r640",
		},
		{
			name: "a zone label wins over the subnet rules",
			node: v1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"example.com/rack": "rack-9"}},
				Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.51.100.200"}}},
			},
			wantID:    "metalvip://n2",
			wantAddrs: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.51.100.200"}},
			wantZone:  "rack-9", wantReg: "r1",
		},
		{
			name: "dual-stack provided IPs both become InternalIPs and IPv6 is written canonically",
			node: v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3",
				Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "2001:DB8:0::7,198.51.100.7"}}},
			wantID: "metalvip://n3",
			wantAddrs: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "2001:db8::7"},
				{Type: v1.NodeInternalIP, Address: "198.51.100.7"},
			},
			wantZone: "z-v6", wantReg: "r6",
		},
		{
			name:    "a foreign node still waiting for its own CCM is skipped",
			node:    v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "f1"}, Spec: v1.NodeSpec{ProviderID: "aws:///i-1", Taints: []v1.Taint{taint}}},
			wantNil: true,
		},
		{
			name: "an initialised foreign node gets empty metadata so nothing changes",
			node: v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "f2"}, Spec: v1.NodeSpec{ProviderID: "aws:///i-2"},
				Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.51.100.9"}}}},
		},
		{
			name:      "a node already ours keeps its providerID",
			node:      v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n4"}, Spec: v1.NodeSpec{ProviderID: "metalvip://n4"}},
			wantID:    "metalvip://n4",
			wantAddrs: nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := &instances{cfg: cfg, recorder: &record.FakeRecorder{}}
			md, err := i.InstanceMetadata(context.Background(), &tc.node)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantNil {
				if md != nil {
					t.Fatalf("metadata = %+v, want nil", md)
				}
				return
			}
			if md.ProviderID != tc.wantID || md.Zone != tc.wantZone || md.Region != tc.wantReg || md.InstanceType != tc.wantType {
				t.Errorf("metadata = %+v, want id %q zone %q region %q type %q", md, tc.wantID, tc.wantZone, tc.wantReg, tc.wantType)
			}
			if !reflect.DeepEqual(md.NodeAddresses, tc.wantAddrs) {
				t.Errorf("addresses = %v, want %v", md.NodeAddresses, tc.wantAddrs)
			}
		})
	}
}

func TestInvalidProvidedIPIsReportedOncePerValue(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	i := &instances{cfg: config.Default(), recorder: rec}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
		cloudproviderapi.AnnotationAlphaProvidedIPAddr: "not-an-ip"}}}
	for range 3 {
		if _, err := i.InstanceMetadata(context.Background(), node); err == nil {
			t.Fatal("invalid provided IP accepted")
		}
	}
	node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr] = "198.51.100.300"
	if _, err := i.InstanceMetadata(context.Background(), node); err == nil {
		t.Fatal("invalid provided IP accepted")
	}
	if got := len(rec.Events); got != 2 {
		t.Errorf("%d events for two bad values retried, want 2", got)
	}
}

func TestInstancesNeverDeleteOrShutDownANode(t *testing.T) {
	i := &instances{cfg: config.Default(), recorder: &record.FakeRecorder{}}
	for _, n := range []*v1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "ours"}, Spec: v1.NodeSpec{ProviderID: "metalvip://ours"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "foreign"}, Spec: v1.NodeSpec{ProviderID: "aws:///i-1"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "new"}},
	} {
		if ok, err := i.InstanceExists(context.Background(), n); !ok || err != nil {
			t.Errorf("InstanceExists(%s) = %v, %v; want true", n.Name, ok, err)
		}
		if off, err := i.InstanceShutdown(context.Background(), n); off || err != nil {
			t.Errorf("InstanceShutdown(%s) = %v, %v; want false", n.Name, off, err)
		}
	}
}

func TestTrimKeepsWhatAnUpdateWouldLose(t *testing.T) {
	obj := func() *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
			Annotations:   map[string]string{lastApplied: "{...}", "keep": "me"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}}
	}
	n, _ := trimManaged(obj())
	if got := n.(*v1.Node); got.ManagedFields != nil || got.Annotations[lastApplied] == "" {
		t.Errorf("a Node keeps its annotations (the framework updates whole Nodes) and loses managed fields: %+v", got.ObjectMeta)
	}
	s, _ := trim(&v1.Service{ObjectMeta: obj().ObjectMeta})
	if got := s.(*v1.Service); got.ManagedFields != nil || got.Annotations[lastApplied] != "" || got.Annotations["keep"] != "me" {
		t.Errorf("a Service loses managed fields and the last-applied copy, nothing else: %+v", got.ObjectMeta)
	}
}
