package metallb

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

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
			name:  "a keepaliveTime alone gives MetalLB's hold time of three keepalives, not metalvip's 90 s",
			in:    doc("BGPPeer", "v1beta2", "r", `{`+base+`, keepaliveTime: 10s}`),
			want:  `{holdTimeSeconds: 30, keepaliveSeconds: 10}`,
			notes: []wantNote{{"spec.holdTimeSeconds", "three times its keepaliveTime 10s"}},
		},
		{
			name: "a BFD profile with an echo interval but echo off sends no echo: not flagged",
			in: doc("BFDProfile", "v1beta1", "fast", `{receiveInterval: 50, echoInterval: 50, echoMode: false}`) +
				doc("BGPPeer", "v1beta2", "r", `{`+base+`, bfdProfile: fast}`),
			want:  `{bfd: {enabled: true, minRxMilliseconds: 50}}`,
			notes: []wantNote{{"spec.bfd", "from BFD profile fast"}},
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
			name: "a source address with a node selector is kept without a CHECK; a connect time in fractions is cut and said, one of 0s left out",
			in:   doc("BGPPeer", "v1beta2", "r", `{`+base+`, sourceAddress: 198.51.100.9, connectTime: 2500ms, nodeSelectors: [{matchLabels: {kubernetes.io/hostname: node1}}]}`),
			want: `{sourceAddress: 198.51.100.9, connectRetrySeconds: 2}`,
			notes: []wantNote{
				{"spec.sourceAddress", "MetalLB opened the session from 198.51.100.9; so does metalvip"},
				{"spec.connectRetrySeconds", "MetalLB's connectTime 2.5s, in whole seconds"},
			},
		},
		{
			name:   "a connect time metalvip refuses is left out, flagged",
			in:     doc("BGPPeer", "v1beta2", "r", `{`+base+`, connectTime: 0s}`),
			absent: []string{"connectRetrySeconds"},
			notes:  []wantNote{{"spec.connectRetrySeconds", "CHECK: MetalLB's connectTime 0s left out"}},
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
			name:  "an unnumbered peer is converted to one with its interface",
			in:    doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, peerASN: 64500, interface: eth0}`),
			want:  `{interface: eth0, myASN: 64512, peerASN: 64500}`,
			notes: []wantNote{{"spec.interface", "MetalLB's unnumbered session over eth0"}},
		},
		{
			name: "an unnumbered peer drops multihop and a source address, and carries both families as MetalLB's did",
			in:   doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, peerASN: 64500, interface: eth0, ebgpMultiHop: true, sourceAddress: 198.51.100.9, dualStackAddressFamily: true}`),
			want: `{interface: eth0}`,
			notes: []wantNote{
				{"spec", "MetalLB's ebgpMultiHop left out"},
				{"spec", "CHECK: MetalLB's sourceAddress 198.51.100.9 left out"},
			},
		},
		{
			name:    "a peer with both an address and an interface is not converted",
			in:      doc("BGPPeer", "v1beta2", "r", `{myASN: 64512, peerASN: 64500, interface: eth0, peerAddress: 198.51.100.1}`),
			skipped: "CHECK: BGPPeer metallb-system/r not converted: it gives both peerAddress and interface",
		},
		{
			name: "what metalvip's sessions do otherwise is flagged: router ID, VRF, both families; a source address on every node too; the connect time is kept",
			in:   doc("BGPPeer", "v1beta2", "r", `{`+base+`, sourceAddress: 198.51.100.9, routerID: 10.0.0.1, connectTime: 5s, vrf: red, dualStackAddressFamily: true}`),
			want: `{sourceAddress: 198.51.100.9, connectRetrySeconds: 5}`,
			notes: []wantNote{
				{"spec.sourceAddress", "CHECK: MetalLB opened the session from 198.51.100.9 on every node"},
				{"spec", "CHECK: MetalLB sent router ID 10.0.0.1"},
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
			if err := Render(&out, c); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out.String(), "s3cret-value") {
				t.Error("the password is in the output")
			}
		})
	}
}
