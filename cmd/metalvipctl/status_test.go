package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/desired"
)

// TestStatusDescribesTheRecord: who announces each address comes from the CCM's
// ServiceAnnouncement, with what may be stale marked; a record left by an earlier Service of
// the same name, or one that cannot be read, says nothing of this one.
func TestStatusDescribesTheRecord(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front", UID: "u2", Generation: 4}}
	rec := func(gen int64, uid types.UID, addrs ...v1alpha1.AnnouncedAddress) *v1alpha1.ServiceAnnouncement {
		return &v1alpha1.ServiceAnnouncement{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front",
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", UID: uid, Controller: new(true)}}}, ObservedGeneration: gen, Addresses: addrs}
	}
	l2 := v1alpha1.AnnouncedAddress{Address: "203.0.113.5", Mode: v1alpha1.AnnouncedL2, Nodes: []string{"node-a", "node-b", "node-c"}}
	for _, tc := range []struct {
		name        string
		rec         *v1alpha1.ServiceAnnouncement
		unreachable map[string]string
		want        string
	}{
		{"L2 with standbys", rec(4, "u2", l2), nil, "node-a (standby node-b, node-c)"},
		{"per client", rec(4, "u2", v1alpha1.AnnouncedAddress{Address: "203.0.113.128", Mode: v1alpha1.AnnouncedL2PerClient, Nodes: []string{"node3", "node1"}}), nil, "node3, node1 (per client)"},
		{"two addresses, BGP refused by one, none eligible", rec(4, "u2",
			v1alpha1.AnnouncedAddress{Address: "203.0.113.66", Mode: v1alpha1.AnnouncedBGP, Nodes: []string{"node1"}, RefusedBy: []string{"node2"}},
			v1alpha1.AnnouncedAddress{Address: "2001:db8::65", Mode: v1alpha1.AnnouncedL2}), nil,
			"203.0.113.66: node1; refused by node2; 2001:db8::65: no eligible node"},
		{"an unreachable node is marked", rec(4, "u2", l2), map[string]string{"node-b": "2026-12-05T04:00:00Z"},
			"node-a (standby node-b, node-c) [stale: the agent of node-b is unreachable since 2026-12-05T04:00:00Z, it may have stopped]"},
		{"an older generation is marked", rec(3, "u2", l2), nil, "node-a (standby node-b, node-c) [stale: the CCM has not seen the Service's latest spec]"},
		{"an unreadable record says so", rec(4, "u2", v1alpha1.AnnouncedAddress{Address: "node-a", Mode: v1alpha1.AnnouncedL2}), nil, `unreadable ServiceAnnouncement: address "node-a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !desired.RecordOf(tc.rec, svc.UID) {
				t.Fatal("the record of the Service's UID is not taken as its record")
			}
			if got := describeRecord(tc.rec, svc, tc.unreachable); !strings.HasPrefix(got, tc.want) {
				t.Errorf("%q, want %q", got, tc.want)
			}
		})
	}
	if desired.RecordOf(rec(4, "u1", l2), svc.UID) {
		t.Error("the record of an earlier Service of the same name is taken as this one's")
	}
}

// TestStatusPrintsTheSameObjectAsJSONAndYAML: -o json and -o yaml carry the same Status, field
// for field, so a script may read either.
func TestStatusPrintsTheSameObjectAsJSONAndYAML(t *testing.T) {
	st := &Status{
		Pools:    []PoolStatus{{Name: "l2", Mode: "L2", AllocatedIPv4: 2, AvailableIPv4: 14, Ready: "True"}},
		Services: []ServiceStatus{{Namespace: "web", Name: "front", Addresses: []string{"203.0.113.1"}, Pool: "l2", AnnouncedBy: "node1 (standby node2)"}},
		Agents:   []AgentStatus{{Node: "node1", Address: "198.51.100.11", Agent: "reachable"}},
	}
	var fromJSON, fromYAML Status
	for _, tc := range []struct {
		output string
		into   *Status
		decode func([]byte, any) error
	}{
		{"json", &fromJSON, json.Unmarshal},
		{"yaml", &fromYAML, func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }},
	} {
		var b strings.Builder
		if err := writeStatus(&b, st, &printFlags{output: tc.output}); err != nil {
			t.Fatalf("-o %s: %v", tc.output, err)
		}
		if err := tc.decode([]byte(b.String()), tc.into); err != nil {
			t.Fatalf("-o %s printed what does not decode as a Status: %v\n%s", tc.output, err, b.String())
		}
		if tc.output == "yaml" && !strings.Contains(b.String(), "announcedBy: node1 (standby node2)") {
			t.Errorf("-o yaml does not name the fields as the json tags do:\n%s", b.String())
		}
	}
	if !reflect.DeepEqual(fromJSON, *st) || !reflect.DeepEqual(fromYAML, *st) {
		t.Errorf("json %+v, yaml %+v; want %+v", fromJSON, fromYAML, *st)
	}
}

// TestStatusPrintsWideAndThroughTemplates: -o wide adds the modes and refusals to the table;
// -o jsonpath and go-template read the fields as -o json names them; a format no printer takes
// is refused before anything is read.
func TestStatusPrintsWideAndThroughTemplates(t *testing.T) {
	st := &Status{
		Services: []ServiceStatus{{Namespace: "web", Name: "front", Addresses: []string{"203.0.113.1"}, Pool: "l2", AnnouncedBy: "node1 (standby node2)",
			Announced: []v1alpha1.AnnouncedAddress{{Address: "203.0.113.1", Mode: v1alpha1.AnnouncedL2, Nodes: []string{"node1", "node2"}, RefusedBy: []string{"node3"}}}},
			{Namespace: "web", Name: "waits", Addresses: []string{}, Pending: "PoolExhausted: no free address in pool l2"}},
	}
	for _, tc := range []struct {
		output string
		want   []string
	}{
		{"", []string{"SERVICE ADDRESSES POOL ANNOUNCED BY", "web/front 203.0.113.1 l2 node1", "web/waits <pending> PoolExhausted: no free address"}},
		{"wide", []string{"SERVICE ADDRESSES POOL MODE REFUSED BY ANNOUNCED BY", "web/front 203.0.113.1 l2 L2 node3 node1 (standby node2)"}},
		{"jsonpath={.services[*].name}", []string{"front waits"}},
		{`go-template={{range .services}}{{.namespace}}/{{.name}}={{.pending}};{{end}}`, []string{"web/front=<no value>;web/waits=PoolExhausted: no free address in pool l2;"}},
	} {
		p := &printFlags{output: tc.output, templates: genericclioptions.NewKubeTemplatePrintFlags()}
		if err := p.check(); err != nil {
			t.Fatalf("-o %q refused: %v", tc.output, err)
		}
		var b strings.Builder
		if err := writeStatus(&b, st, p); err != nil {
			t.Fatalf("-o %q: %v", tc.output, err)
		}
		flat := strings.Join(strings.Fields(b.String()), " ") // columns apart by any spaces
		for _, w := range tc.want {
			if !strings.Contains(flat, strings.Join(strings.Fields(w), " ")) {
				t.Errorf("-o %q does not print %q:\n%s", tc.output, w, b.String())
			}
		}
	}
	for _, bad := range []string{"xml", "jsonpath={.services[", "name"} {
		p := &printFlags{output: bad, templates: genericclioptions.NewKubeTemplatePrintFlags()}
		if err := p.check(); err == nil {
			t.Errorf("-o %q taken", bad)
		}
	}
}
