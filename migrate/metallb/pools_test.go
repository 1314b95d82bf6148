package metallb

import "testing"

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
			name: "communities: aliases resolved through Community objects, large ones kept, undefined ones left out and flagged",
			in: pool("gold", `{addresses: [203.0.113.0/24]}`) +
				doc("Community", "v1beta1", "c", `{communities: [{name: no-export, value: "65535:65281"}, {name: big, value: "large:1:2:3"}]}`) +
				doc("BGPAdvertisement", "v1beta1", "bgp", `{communities: [no-export, "64500:1", big, "large:4:5:6", nowhere, "70000:1"], localPref: 200}`),
			pool: "gold",
			want: `{announce: {mode: BGP, bgp: {communities: ["64500:1", "65535:65281"], largeCommunities: ["1:2:3", "4:5:6"], localPref: 200}}}`,
			notes: []wantNote{
				{"spec.announce.bgp.communities", `65535:65281 is MetalLB's community alias "no-export"`},
				{"spec.announce.bgp.largeCommunities", `1:2:3 is MetalLB's community alias "big"`},
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
				{"spec.announce.bgp.aggregationLength", "CHECK: MetalLB announced this pool's addresses with the prefix lengths [24 32] at once"},
				{"spec.announce.bgp", "CHECK: agg advertised only to the peers r1"},
				{"spec.announce.bgp", "CHECK: agg prepended the AS 2 times"},
				{"spec.announce.bgp.communities", "CHECK: MetalLB attached each BGPAdvertisement's communities to its own announcement"},
				{"spec.announce.bgp.localPref", "CHECK: the BGPAdvertisements give different local preferences [100 50]"},
			},
		},
		{
			name: "one aggregation length for the pool is kept",
			in: labelled("gold", "{announce: bgp}", `{addresses: [203.0.113.0/24, "2001:db8:100::/64"]}`) +
				doc("BGPAdvertisement", "v1beta1", "agg", `{ipAddressPoolSelectors: [{matchLabels: {announce: bgp}}], aggregationLength: 24, aggregationLengthV6: 64}`),
			pool: "gold",
			want: `{announce: {mode: BGP, bgp: {aggregationLength: 24, aggregationLengthV6: 64}}}`,
		},
		{
			name: "an aggregation of a family the pool does not hold changes nothing and is not flagged",
			in: labelled("gold", "{announce: bgp}", `{addresses: [203.0.113.0/24]}`) +
				doc("BGPAdvertisement", "v1beta1", "agg", `{ipAddressPoolSelectors: [{matchLabels: {announce: bgp}}], aggregationLengthV6: 64}`),
			pool: "gold",
			want: `{announce: {mode: BGP}}`,
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
