package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"pgregory.net/rapid"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files of the converter")

// convertText converts MetalLB objects given as YAML documents, as read from a file.
func convertText(t *testing.T, docs string) conversion {
	t.Helper()
	in := metalLBConfig{Namespace: "metallb-system"}
	objs, err := decodeObjects(strings.NewReader(docs))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if _, err := in.take(u); err != nil {
			t.Fatal(err)
		}
	}
	return convertMetalLB(in, "metalvip-bgp-secrets")
}

func object(t *testing.T, c conversion, kind, name string) convertedObject {
	t.Helper()
	for _, o := range c.Objects {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s among %d objects; general notes %q", kind, name, len(c.Objects), c.General)
	return convertedObject{}
}

// specContains reports the first field of want (YAML) that spec lacks or holds otherwise.
func specContains(t *testing.T, spec any, want string) string {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var got, w any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	return contained(w, got, "spec")
}

func contained(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s (got %v)", path, got)
		}
		for _, k := range sortedKeys(w) {
			if d := contained(w[k], g[k], path+"."+k); d != "" {
				return d
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s (got %v, want %v)", path, got, want)
		}
		for i := range w {
			if d := contained(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s (got %v, want %v)", path, got, want)
		}
	}
	return ""
}

// absent reports fields of the spec that must not be printed, by top-level-dotted path.
func absent(t *testing.T, spec any, paths ...string) string {
	t.Helper()
	raw, _ := json.Marshal(spec)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	for _, p := range paths {
		var cur any = m
		found := true
		for seg := range strings.SplitSeq(p, ".") {
			mm, ok := cur.(map[string]any)
			if !ok {
				found = false
				break
			}
			if cur, ok = mm[seg]; !ok {
				found = false
				break
			}
		}
		if found {
			return p
		}
	}
	return ""
}

type wantNote struct {
	path, text string // text is a substring; a CHECK note's text starts with "CHECK:"
}

func hasNote(o convertedObject, w wantNote) bool {
	return slices.ContainsFunc(o.Notes, func(n note) bool { return n.Path == w.path && strings.Contains(n.Text, w.text) })
}

const header = `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: %s, namespace: metallb-system%s}
spec: %s
`

func pool(name, spec string) string { return fmt.Sprintf(header, name, "", spec) + "---\n" }
func labelled(name, labels, spec string) string {
	return fmt.Sprintf(header, name, ", labels: "+labels, spec) + "---\n"
}

func doc(kind, version, name, spec string) string {
	return fmt.Sprintf("apiVersion: metallb.io/%s\nkind: %s\nmetadata: {name: %s, namespace: metallb-system}\nspec: %s\n---\n", version, kind, name, spec)
}

func TestConvertingPools(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     string
		pool   string
		want   string   // YAML the printed spec contains
		absent []string // fields the printed spec must not have
		notes  []wantNote
	}{
		{
			name: "a pool keeps its name, addresses and flags; a spaced range and a CIDR with host bits are rewritten as metalvip takes them",
			in:   pool("gold", `{addresses: ["203.0.113.7/24", "2001:db8::10 - 2001:db8::20"], avoidBuggyIPs: true, autoAssign: false}`) + doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool: "gold",
			want: `{addresses: [203.0.113.0/24, "2001:db8::10-2001:db8::20"], avoidBuggyIPs: true, autoAssign: false, announce: {mode: L2}}`,
			notes: []wantNote{
				{"spec.addresses", `"203.0.113.7/24" written as 203.0.113.0/24`},
				{"spec.addresses", `"2001:db8::10 - 2001:db8::20" written as 2001:db8::10-2001:db8::20`},
			},
		},
		{
			name:   "autoAssign true, MetalLB's default, is not printed",
			in:     pool("gold", `{addresses: [203.0.113.0/24], autoAssign: true}`) + doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool:   "gold",
			absent: []string{"autoAssign", "priority", "serviceAllocation"},
		},
		{
			name: "an address MetalLB could not read is left out and flagged",
			in:   pool("gold", `{addresses: [203.0.113.0/24, "203.0.113.9-203.0.113.1", nonsense]}`) + doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool: "gold",
			want: `{addresses: [203.0.113.0/24]}`,
			notes: []wantNote{
				{"spec.addresses", `CHECK: "203.0.113.9-203.0.113.1" left out`},
				{"spec.addresses", `CHECK: "nonsense" left out`},
			},
		},
		{
			name: "an L2Advertisement's interfaces and node selectors on one label become the pool's, exactly",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "l2", `{ipAddressPools: [gold], interfaces: [eth1, bond0], nodeSelectors: [{matchLabels: {rack: a}}, {matchExpressions: [{key: rack, operator: In, values: [b, c]}]}]}`),
			pool: "gold",
			want: `{announce: {mode: L2, l2: {interfaces: [bond0, eth1]}, nodeSelector: {matchExpressions: [{key: rack, operator: In, values: [a, b, c]}]}}}`,
		},
		{
			name: "node selectors on different labels keep the first and say so",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "l2", `{nodeSelectors: [{matchLabels: {rack: a}}, {matchLabels: {zone: z}}]}`),
			pool:  "gold",
			want:  `{announce: {nodeSelector: {matchLabels: {rack: a}}}}`,
			notes: []wantNote{{"spec.announce.nodeSelector", "CHECK: MetalLB announced from nodes matching any of {rack=a}, {zone=z}"}},
		},
		{
			name: "an advertisement without a node selector makes every node announce, whatever the others select",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "a", `{nodeSelectors: [{matchLabels: {rack: a}}]}`) +
				doc("L2Advertisement", "v1beta1", "b", `{ipAddressPools: [gold]}`),
			pool:   "gold",
			absent: []string{"announce.nodeSelector"},
		},
		{
			name: "MetalLB's every-interface default is explained, and interfaces paired with nodes are flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) + pool("silver", `{addresses: [203.0.114.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "plain", `{ipAddressPools: [gold]}`) +
				doc("L2Advertisement", "v1beta1", "a", `{ipAddressPools: [silver], interfaces: [eth1], nodeSelectors: [{matchLabels: {rack: a}}]}`) +
				doc("L2Advertisement", "v1beta1", "b", `{ipAddressPools: [silver], interfaces: [eth2], nodeSelectors: [{matchLabels: {rack: b}}]}`),
			pool:  "silver",
			want:  `{announce: {l2: {interfaces: [eth1, eth2]}}}`,
			notes: []wantNote{{"spec.announce.l2.interfaces", "CHECK: MetalLB paired interfaces with nodes per L2Advertisement"}},
		},
		{
			name: "L2 service selectors and weighted node preferences are flagged; the heaviest preference is kept",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "l2", `{serviceSelectors: [{matchLabels: {tier: web}}], preferredNodeSelectors: [{weight: 10, preference: {matchLabels: {big: "no"}}}, {weight: 90, preference: {matchLabels: {big: "yes"}}}]}`),
			pool: "gold",
			want: `{announce: {preferredNodeSelector: {matchLabels: {big: "yes"}}}}`,
			notes: []wantNote{
				{"spec.announce", "CHECK: L2Advertisement l2 announced only Services matching {tier=web}"},
				{"spec.announce.preferredNodeSelector", "CHECK: of MetalLB's weighted preferences 90:{big=yes}, 10:{big=no} the heaviest is kept"},
			},
		},
		{
			name:  "a pool no advertisement selects is announced by L2, flagged",
			in:    pool("gold", `{addresses: [203.0.113.0/24]}`),
			pool:  "gold",
			want:  `{announce: {mode: L2}}`,
			notes: []wantNote{{"spec.announce.mode", "CHECK: no L2Advertisement or BGPAdvertisement selects this pool"}},
		},
		{
			name: "a pool advertised by L2 and BGP becomes a BGP pool, flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("L2Advertisement", "v1beta1", "l2", `{}`) + doc("BGPAdvertisement", "v1beta1", "bgp", `{}`),
			pool:  "gold",
			want:  `{announce: {mode: BGP}}`,
			notes: []wantNote{{"spec.announce.mode", "CHECK: MetalLB announced this pool both by L2 (l2) and by BGP (bgp)"}},
		},
		{
			name: "communities: aliases resolved through Community objects, large and undefined ones left out and flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("Community", "v1beta1", "c", `{communities: [{name: no-export, value: "65535:65281"}, {name: big, value: "large:1:2:3"}]}`) +
				doc("BGPAdvertisement", "v1beta1", "bgp", `{communities: [no-export, "64500:1", big, "large:4:5:6", nowhere, "70000:1"], localPref: 200}`),
			pool: "gold",
			want: `{announce: {mode: BGP, bgp: {communities: ["64500:1", "65535:65281"], localPref: 200}}}`,
			notes: []wantNote{
				{"spec.announce.bgp.communities", `65535:65281 is MetalLB's community alias "no-export"`},
				{"spec.announce.bgp.communities", "CHECK: large community large:1:2:3 (from bgp) left out"},
				{"spec.announce.bgp.communities", "CHECK: large community large:4:5:6 (from bgp) left out"},
				{"spec.announce.bgp.communities", `CHECK: community "nowhere" (from bgp) left out: no Community object defines that name`},
				{"spec.announce.bgp.communities", `CHECK: community "70000:1" (from bgp) left out`},
			},
		},
		{
			name: "aggregation, peer limits, AS prepends and differing advertisements are flagged; /32 aggregation is MetalLB's default and not",
			in: labelled("gold", "{announce: bgp}", `{addresses: [203.0.113.0/24]}`) +
				doc("BGPAdvertisement", "v1beta1", "agg", `{ipAddressPoolSelectors: [{matchLabels: {announce: bgp}}], aggregationLength: 24, aggregationLengthV6: 128, peers: [r1], asPathPrepend: 2, localPref: 100, communities: ["1:1"]}`) +
				doc("BGPAdvertisement", "v1beta1", "plain", `{ipAddressPools: [gold], aggregationLength: 32, localPref: 50}`),
			pool: "gold",
			want: `{announce: {mode: BGP, bgp: {communities: ["1:1"], localPref: 100}}}`,
			notes: []wantNote{
				{"spec.announce.bgp", "CHECK: agg aggregated IPv4 routes to /24"},
				{"spec.announce.bgp", "CHECK: agg advertised only to the peers r1"},
				{"spec.announce.bgp", "CHECK: agg prepended the AS 2 times"},
				{"spec.announce.bgp.communities", "CHECK: MetalLB attached each BGPAdvertisement's communities to its own announcement"},
				{"spec.announce.bgp.localPref", "CHECK: the BGPAdvertisements give different local preferences [100 50]"},
			},
		},
		{
			name: "a pinned pool without a priority is ordered before the pools without a serviceAllocation, as MetalLB tries them",
			in: pool("pinned", `{addresses: [203.0.113.0/24], serviceAllocation: {namespaces: [team-a]}}`) +
				pool("prio", `{addresses: [203.0.114.0/24], serviceAllocation: {priority: 7, namespaces: [team-a]}}`) +
				pool("open", `{addresses: [203.0.115.0/24]}`) + doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool:  "pinned",
			want:  `{priority: 8, serviceAllocation: {namespaces: [team-a]}}`,
			notes: []wantNote{{"spec.priority", "priority 8 keeps that order"}},
		},
		{
			name: "a serviceAllocation with a priority alone keeps the priority and limits nothing",
			in: pool("prio", `{addresses: [203.0.114.0/24], serviceAllocation: {priority: 3}}`) +
				doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool:   "prio",
			want:   `{priority: 3}`,
			absent: []string{"serviceAllocation"},
		},
		{
			name: "namespace selectors on one label become one selector; service selectors that cannot merge keep the first, flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24], serviceAllocation: {namespaceSelectors: [{matchLabels: {team: a}}, {matchLabels: {team: b}}], serviceSelectors: [{matchLabels: {tier: web}}, {matchLabels: {exposed: "true"}}]}}`) +
				doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool: "gold",
			want: `{serviceAllocation: {namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [a, b]}]}, serviceSelector: {matchLabels: {tier: web}}}}`,
			notes: []wantNote{
				{"spec.serviceAllocation.serviceSelector", "CHECK: MetalLB admitted Services matching any of {tier=web}, {exposed=true}"},
			},
		},
		{
			name: "namespaces listed or selected become one list when the namespaces are known, flagged",
			in: `{apiVersion: v1, kind: Namespace, metadata: {name: web, labels: {team: a}}}` + "\n---\n" +
				`{apiVersion: v1, kind: Namespace, metadata: {name: other}}` + "\n---\n" +
				pool("gold", `{addresses: [203.0.113.0/24], serviceAllocation: {namespaces: [ops], namespaceSelectors: [{matchLabels: {team: a}}]}}`) +
				doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool:  "gold",
			want:  `{serviceAllocation: {namespaces: [ops, web]}}`,
			notes: []wantNote{{"spec.serviceAllocation.namespaces", "CHECK: MetalLB admitted the namespaces listed or matching {team=a}"}},
		},
		{
			name: "namespaces listed or selected keep the list when the namespaces are not known, flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24], serviceAllocation: {namespaces: [ops], namespaceSelectors: [{matchLabels: {team: a}}]}}`) +
				doc("L2Advertisement", "v1beta1", "all", `{}`),
			pool:   "gold",
			want:   `{serviceAllocation: {namespaces: [ops]}}`,
			absent: []string{"serviceAllocation.namespaceSelector"},
			notes:  []wantNote{{"spec.serviceAllocation.namespaces", "CHECK: MetalLB also admitted namespaces matching {team=a}"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := convertText(t, tc.in)
			o := object(t, c, "IPPool", tc.pool)
			if tc.want != "" {
				if d := specContains(t, o.Spec, tc.want); d != "" {
					t.Errorf("printed %s differs from what MetalLB's configuration says; notes %q", d, o.Notes)
				}
			}
			if p := absent(t, o.Spec, tc.absent...); p != "" {
				t.Errorf("%s printed, want it left out", p)
			}
			for _, n := range tc.notes {
				if !hasNote(o, n) {
					t.Errorf("no note at %s saying %q; notes %q", n.path, n.text, o.Notes)
				}
			}
			if got, want := countChecks(o), countWantChecks(tc.notes); got != want {
				t.Errorf("%d CHECK notes, want %d: %q", got, want, o.Notes)
			}
		})
	}
}

func countChecks(o convertedObject) int {
	n := 0
	for _, nt := range o.Notes {
		if strings.HasPrefix(nt.Text, "CHECK:") {
			n++
		}
	}
	return n
}

func countWantChecks(ws []wantNote) int {
	n := 0
	for _, w := range ws {
		if strings.HasPrefix(w.text, "CHECK:") {
			n++
		}
	}
	return n
}

func TestConvertingPeers(t *testing.T) {
	const base = `myASN: 64512, peerASN: 64500, peerAddress: 198.51.100.1`
	for _, tc := range []struct {
		name    string
		in      string
		want    string
		absent  []string
		notes   []wantNote
		skipped string // when set, no peer is printed and a general note says this
	}{
		{
			name:   "a plain peer maps field by field; MetalLB's default port is not printed",
			in:     doc("BGPPeer", "v1beta2", "r", `{`+base+`, peerPort: 179, holdTime: 9s, keepaliveTime: 3s, enableGracefulRestart: true, nodeSelectors: [{matchLabels: {bgp: "on"}}]}`),
			want:   `{address: 198.51.100.1, myASN: 64512, peerASN: 64500, holdTimeSeconds: 9, keepaliveSeconds: 3, gracefulRestart: true, nodeSelector: {matchLabels: {bgp: "on"}}}`,
			absent: []string{"port", "bfd", "passwordSecretRef", "ebgpMultihop"},
		},
		{
			name: "a BFD profile merges into the peer's bfd settings; echo and passive modes are flagged",
			in: doc("BFDProfile", "v1beta1", "fast", `{receiveInterval: 50, transmitInterval: 60, detectMultiplier: 4, echoMode: true, passiveMode: true}`) +
				doc("BGPPeer", "v1beta2", "r", `{`+base+`, bfdProfile: fast}`),
			want: `{bfd: {enabled: true, minRxMilliseconds: 50, minTxMilliseconds: 60, multiplier: 4}}`,
			notes: []wantNote{
				{"spec.bfd", "from BFD profile fast"},
				{"spec.bfd", "CHECK: the profile's echo mode is not kept"},
				{"spec.bfd", "CHECK: the profile is passive"},
			},
		},
		{
			name:   "a BFD profile that does not exist gives no bfd, flagged",
			in:     doc("BGPPeer", "v1beta2", "r", `{`+base+`, bfdProfile: missing}`),
			absent: []string{"bfd"},
			notes:  []wantNote{{"spec", `CHECK: BFD profile "missing" does not exist`}},
		},
		{
			name: "a multihop router keeps any distance and loses its BFD, flagged: metalvip's BFD is single-hop",
			in: doc("BFDProfile", "v1beta1", "fast", `{receiveInterval: 50}`) +
				doc("BGPPeer", "v1beta2", "r", `{`+base+`, bfdProfile: fast, ebgpMultiHop: true}`),
			want:   `{ebgpMultihop: 255}`,
			absent: []string{"bfd"},
			notes:  []wantNote{{"spec", "CHECK: BFD profile fast left out: metalvip's BFD is single-hop"}},
		},
		{
			name:  "a password Secret moves to the password namespace, with the command that copies it",
			in:    doc("BGPPeer", "v1beta2", "r", `{`+base+`, passwordSecret: {name: r-pass}}`),
			want:  `{passwordSecretRef: {namespace: metalvip-bgp-secrets, name: r-pass, key: password}}`,
			notes: []wantNote{{"spec.passwordSecretRef", "CHECK: the CCM reads passwords only in metalvip-bgp-secrets: copy MetalLB's Secret there before applying, or the session stays down:\nkubectl -n metalvip-bgp-secrets create secret generic r-pass --from-literal=password=\"$(kubectl -n metallb-system get secret r-pass"}},
		},
		{
			name:  "a plain-text password is never printed: the peer refers to a Secret to create",
			in:    doc("BGPPeer", "v1beta2", "r", `{`+base+`, password: s3cret-value}`),
			want:  `{passwordSecretRef: {namespace: metalvip-bgp-secrets, name: r-password, key: password}}`,
			notes: []wantNote{{"spec.passwordSecretRef", "CHECK: MetalLB's BGPPeer holds the password in plain text (not printed here)"}},
		},
		{
			name:   "a keepalive over a third of the hold time is left out, flagged",
			in:     doc("BGPPeer", "v1beta2", "r", `{`+base+`, holdTime: 90s, keepaliveTime: 60s}`),
			want:   `{holdTimeSeconds: 90}`,
			absent: []string{"keepaliveSeconds"},
			notes:  []wantNote{{"spec.keepaliveSeconds", "CHECK: MetalLB's keepaliveTime 1m0s left out"}},
		},
		{
			name:   "a hold time metalvip refuses is left out, flagged; fractions of seconds are cut and said",
			in:     doc("BGPPeer", "v1beta2", "r", `{`+base+`, holdTime: 2s, keepaliveTime: 1500ms}`),
			want:   `{keepaliveSeconds: 1}`,
			absent: []string{"holdTimeSeconds"},
			notes: []wantNote{
				{"spec.holdTimeSeconds", "CHECK: MetalLB's holdTime 2s left out"},
				{"spec.keepaliveSeconds", "MetalLB's keepaliveTime 1.5s, in whole seconds"},
			},
		},
		{
			name:  "localASN is the AS the router sees, so it is metalvip's myASN",
			in:    doc("BGPPeer", "v1beta2", "r", `{`+base+`, localASN: 65001}`),
			want:  `{myASN: 65001}`,
			notes: []wantNote{{"spec.myASN", "MetalLB's localASN 65001"}},
		},
		{
			name:  "dynamicASN internal means the router is in the nodes' AS",
			in:    doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, dynamicASN: internal, peerAddress: 198.51.100.1}`),
			want:  `{peerASN: 64512}`,
			notes: []wantNote{{"spec.peerASN", "dynamicASN internal"}},
		},
		{
			name:    "dynamicASN external names no AS, so the peer is not converted",
			in:      doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, dynamicASN: external, peerAddress: 198.51.100.1}`),
			skipped: "CHECK: BGPPeer metallb-system/r not converted: dynamicASN external",
		},
		{
			name:    "an unnumbered peer is not converted",
			in:      doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, peerASN: 64500, interface: eth0}`),
			skipped: "CHECK: BGPPeer metallb-system/r not converted: it peers unnumbered over interface eth0",
		},
		{
			name: "what metalvip's sessions do otherwise is flagged: source address, router ID, connect time, VRF, both families",
			in:   doc("BGPPeer", "v1beta2", "r", `{`+base+`, sourceAddress: 198.51.100.9, routerID: 10.0.0.1, connectTime: 5s, vrf: red, dualStackAddressFamily: true}`),
			notes: []wantNote{
				{"spec", "CHECK: MetalLB opened the session from 198.51.100.9"},
				{"spec", "CHECK: MetalLB sent router ID 10.0.0.1"},
				{"spec", "CHECK: MetalLB's connectTime 5s is not kept"},
				{"spec", "CHECK: MetalLB peered in VRF red"},
				{"spec", "CHECK: MetalLB carried both address families"},
			},
		},
		{
			name:  "a peer metalvip would refuse as printed says so",
			in:    doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, peerASN: 64500, peerAddress: "fe80::1"}`),
			notes: []wantNote{{"", "CHECK: metalvip will not use this peer as printed: spec.address: fe80::1 is link-local"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := convertText(t, tc.in)
			if tc.skipped != "" {
				if len(c.Objects) != 0 || !slices.ContainsFunc(c.General, func(g string) bool { return strings.HasPrefix(g, tc.skipped) }) {
					t.Fatalf("objects %v, general notes %q; want none and a note %q", c.Objects, c.General, tc.skipped)
				}
				return
			}
			o := object(t, c, "BGPPeer", "r")
			if tc.want != "" {
				if d := specContains(t, o.Spec, tc.want); d != "" {
					t.Errorf("printed %s differs from what MetalLB's configuration says; notes %q", d, o.Notes)
				}
			}
			if p := absent(t, o.Spec, tc.absent...); p != "" {
				t.Errorf("%s printed, want it left out", p)
			}
			for _, n := range tc.notes {
				if !hasNote(o, n) {
					t.Errorf("no note at %q saying %q; notes %q", n.path, n.text, o.Notes)
				}
			}
			if got, want := countChecks(o), countWantChecks(tc.notes); got != want {
				t.Errorf("%d CHECK notes, want %d: %q", got, want, o.Notes)
			}
			var out bytes.Buffer
			if err := renderConversion(&out, c); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), "s3cret-value") {
				t.Error("the password is in the output")
			}
		})
	}
}

func TestReadingMetalLBObjects(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       string
		general  string // a general note that must be there
		skipped  string // a skip line that must be there
		objects  int
		errorHas string
	}{
		{
			name:    "a field this converter does not know is reported, not dropped unseen",
			in:      pool("gold", `{addresses: [203.0.113.0/24], newKnob: 1, serviceAllocation: {priority: 1, future: x}}`),
			general: "CHECK: IPAddressPool gold in metallb-system has fields this converter does not know (a newer MetalLB?), not converted: spec.newKnob, spec.serviceAllocation.future",
			objects: 1,
		},
		{
			name:    "an object of another namespace is skipped: MetalLB reads only its own",
			in:      strings.Replace(pool("gold", `{addresses: [203.0.113.0/24]}`), "metallb-system", "elsewhere", 1),
			skipped: "IPAddressPool elsewhere/gold: not in namespace metallb-system",
		},
		{
			name:    "MetalLB's status objects and other kinds are skipped and counted",
			in:      doc("ServiceL2Status", "v1beta1", "s", `{}`) + "{apiVersion: apps/v1, kind: Deployment, metadata: {name: controller}}\n---\n",
			skipped: "1 Deployment objects: not MetalLB's configuration",
		},
		{
			name:    "a List's items are read",
			in:      `{apiVersion: v1, kind: List, items: [{apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: gold, namespace: metallb-system}, spec: {addresses: [203.0.113.0/24]}}]}`,
			objects: 1,
		},
		{
			name:    "an advertisement naming a pool that does not exist is reported",
			in:      pool("gold", `{addresses: [203.0.113.0/24]}`) + doc("L2Advertisement", "v1beta1", "l2", `{ipAddressPools: [silver]}`),
			general: `CHECK: L2Advertisement metallb-system/l2 names IPAddressPool "silver", which does not exist`,
			objects: 1,
		},
		{
			name:     "an object that is not MetalLB's shape is an error naming it",
			in:       pool("gold", `{addresses: "203.0.113.0/24"}`),
			errorHas: "IPAddressPool metallb-system/gold does not decode as MetalLB's IPAddressPool",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "in.yaml")
			if err := os.WriteFile(path, []byte(tc.in), 0o600); err != nil {
				t.Fatal(err)
			}
			in := metalLBConfig{Namespace: "metallb-system"}
			skipped, err := readMetalLBFiles(&in, []string{dir}, nil)
			if tc.errorHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errorHas) {
					t.Fatalf("err = %v, want one containing %q", err, tc.errorHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.skipped != "" && !slices.ContainsFunc(skipped, func(s string) bool { return strings.HasPrefix(s, tc.skipped) }) {
				t.Errorf("skipped %q, want a line starting %q", skipped, tc.skipped)
			}
			c := convertMetalLB(in, "metalvip-bgp-secrets")
			if len(c.Objects) != tc.objects {
				t.Errorf("%d objects, want %d", len(c.Objects), tc.objects)
			}
			if tc.general != "" && !slices.Contains(c.General, tc.general) {
				t.Errorf("general notes %q, want %q", c.General, tc.general)
			}
		})
	}
}

// TestTheOutputOfTheTestConfiguration renders the configuration test/migration applies and
// compares it with testdata/migrate/metallb.golden: every comment and its place, every field
// and its order. Run with -update after an intended change and read the diff.
func TestTheOutputOfTheTestConfiguration(t *testing.T) {
	in := metalLBConfig{Namespace: "metallb-system"}
	src := filepath.Join("..", "..", "test", "migration", "testdata", "metallb.yaml")
	if _, err := readMetalLBFiles(&in, []string{src, filepath.Join("testdata", "migrate", "extra.yaml")}, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := renderConversion(&out, convertMetalLB(in, "metalvip-bgp-secrets")); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "migrate", "metallb.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("output differs from %s (run with -update and read the diff):\n%s", golden, out.String())
	}
	// The output is YAML a client reads back as the objects converted.
	objs, err := decodeObjects(&out)
	if err != nil {
		t.Fatalf("the output does not parse: %v", err)
	}
	for _, u := range objs {
		if u.GetAPIVersion() != "metalvip.io/v1alpha1" || u.GetLabels()[convertedLabel] != "metallb" {
			t.Errorf("%s %s: apiVersion %s, labels %v", u.GetKind(), u.GetName(), u.GetAPIVersion(), u.GetLabels())
		}
	}
	// Every CHECK comment is counted in the header.
	checks := strings.Count(string(want), "# CHECK:")
	if !strings.Contains(string(want), fmt.Sprintf("CHECK: mark where metalvip will not do what MetalLB did (%d here)", checks)) {
		t.Errorf("the header does not count the %d CHECK comments", checks)
	}
}

// TestMergedSelectorsMatchWhatMetalLBMatched: when mergeSelectors says it is exact, the one
// selector matches exactly the label sets one of MetalLB's selectors matched.
func TestMergedSelectorsMatchWhatMetalLBMatched(t *testing.T) {
	keys, values := []string{"rack", "zone"}, []string{"a", "b", "c"}
	selector := rapid.Custom(func(t *rapid.T) metav1.LabelSelector {
		k := rapid.SampledFrom(keys).Draw(t, "key")
		switch rapid.IntRange(0, 3).Draw(t, "shape") {
		case 0:
			return metav1.LabelSelector{MatchLabels: map[string]string{k: rapid.SampledFrom(values).Draw(t, "value")}}
		case 1:
			vs := rapid.SliceOfNDistinct(rapid.SampledFrom(values), 1, 3, rapid.ID[string]).Draw(t, "values")
			return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpIn, Values: vs}}}
		case 2:
			return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpExists}}}
		default:
			return metav1.LabelSelector{}
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		sels := rapid.SliceOfN(selector, 1, 4).Draw(t, "selectors")
		merged, exact := mergeSelectors(sels)
		matchesMerged := func(l labels.Set) bool {
			if merged == nil {
				return true
			}
			s, err := metav1.LabelSelectorAsSelector(merged)
			if err != nil {
				t.Fatalf("merged selector %v does not parse: %v", merged, err)
			}
			return s.Matches(l)
		}
		for range 20 {
			l := labels.Set{}
			for _, k := range keys {
				if rapid.Bool().Draw(t, "has "+k) {
					l[k] = rapid.SampledFrom(values).Draw(t, k)
				}
			}
			metalLB := false
			for i := range sels {
				s, _ := metav1.LabelSelectorAsSelector(&sels[i])
				metalLB = metalLB || s.Matches(l)
			}
			if exact && matchesMerged(l) != metalLB {
				t.Fatalf("selectors %v merged into %v (exact) disagree on %v: merged %v, MetalLB %v", sels, merged, l, matchesMerged(l), metalLB)
			}
			if !exact && matchesMerged(l) && !metalLB {
				t.Fatalf("the inexact merge %v of %v matches %v, which none of MetalLB's did: it must only narrow", merged, sels, l)
			}
		}
	})
}

// FuzzMigrateMetalLB: whatever MetalLB objects a file holds, the converter does not panic, and
// what it prints parses back as YAML.
func FuzzMigrateMetalLB(f *testing.F) {
	seed, err := os.ReadFile(filepath.Join("..", "..", "test", "migration", "testdata", "metallb.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	f.Add(pool("p", `{addresses: ["203.0.113.0 - 203.0.113.9"], serviceAllocation: {namespaceSelectors: [{matchLabels: {a: b}}, {}]}}`))
	f.Add(doc("BGPPeer", "v1beta2", "r", `{myASN: 1, peerASN: 2, peerAddress: "::1", holdTime: 1h, keepaliveTime: -5s}`))
	f.Fuzz(func(t *testing.T, text string) {
		objs, err := decodeObjects(strings.NewReader(text))
		if err != nil {
			return
		}
		in := metalLBConfig{Namespace: "metallb-system"}
		for _, u := range objs {
			if _, err := in.take(u); err != nil {
				return
			}
		}
		var out bytes.Buffer
		if err := renderConversion(&out, convertMetalLB(in, "metalvip-bgp-secrets")); err != nil {
			t.Fatalf("render: %v", err)
		}
		if _, err := decodeObjects(&out); err != nil {
			t.Fatalf("the output does not parse: %v\n%s", err, out.String())
		}
	})
}
