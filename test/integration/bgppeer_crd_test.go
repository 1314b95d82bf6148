package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"pgregory.net/rapid"

	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// TestBGPPeerCRDValidation sends peers straight to the API server: the CRD's schema and CEL rules
// alone must refuse what the agents would refuse, with a message that says what to write
// instead. Every accepted peer is then given, converted as the CCM and the agent convert it,
// to a real BGP speaker of the agent, whose own validation must take it.
func TestBGPPeerCRDValidation(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
	speaker := newValidatingSpeaker(t)
	const peer = `address: 198.51.100.1, peerASN: 64496, myASN: 64497`
	cases := []crdCase{
		{"a plain peer is accepted", `{` + peer + `}`, ""},
		{"a full peer is accepted", `{address: "2001:db8:1::1", port: 1179, peerASN: 64496, myASN: 64497, holdTimeSeconds: 9, keepaliveSeconds: 3,
			nodeSelector: {matchLabels: {rack: a}}, bfd: {enabled: true, minRxMilliseconds: 100, minTxMilliseconds: 100, multiplier: 3},
			passwordSecretRef: {namespace: kube-system, name: bgp.password, key: password_1}, gracefulRestart: true, ttlSecurity: true}`, ""},
		{"a unique-local IPv6 peer is accepted", `{address: "fd00::1", peerASN: 64496, myASN: 64497}`, ""},
		{"GTSM with multihop is accepted", `{` + peer + `, ebgpMultihop: 3, ttlSecurity: true}`, ""},
		{"a keepalive of a third of the default hold time is accepted", `{` + peer + `, keepaliveSeconds: 30}`, ""},
		{"hold time 0 without a keepalive is accepted", `{` + peer + `, holdTimeSeconds: 0}`, ""},
		{"hold time 0 with keepalive 0 is accepted", `{` + peer + `, holdTimeSeconds: 0, keepaliveSeconds: 0}`, ""},
		{"the shortest hold time with a keepalive is accepted", `{` + peer + `, holdTimeSeconds: 3, keepaliveSeconds: 1}`, ""},
		{"ClusterIP ranges of both families are accepted", `{` + peer + `, serviceCIDRs: ["10.96.0.0/16", "fd00:10:96::/112"]}`, ""},
		{"a ClusterIP range that is no CIDR is refused", `{` + peer + `, serviceCIDRs: ["10.96.0.0"]}`, "each must be a CIDR such as 10.96.0.0/16"},
		{"a ClusterIP range with bits after its length is refused", `{` + peer + `, serviceCIDRs: ["10.96.0.1/16"]}`, "must not have bits set after its prefix length"},
		{"a ClusterIP range wider than a /8 is refused", `{` + peer + `, serviceCIDRs: ["10.0.0.0/7"]}`, "at most a /8"},
		{"a ClusterIP range wider than a /48 is refused", `{` + peer + `, serviceCIDRs: ["fd00::/40"]}`, "at most a /8 (IPv4) or a /48 (IPv6)"},

		{"a bad address is refused", `{address: 198.51.100.300, peerASN: 64496, myASN: 64497}`, "must be an IP address"},
		{"a zoned address is refused", `{address: "fe80::1%eth0", peerASN: 64496, myASN: 64497}`, "spec.address: Invalid value: \"fe80::1%eth0\": must be an IP address such as 198.51.100.1"},
		{"an IPv4-mapped IPv6 address is refused", `{address: "::ffff:198.51.100.1", peerASN: 64496, myASN: 64497}`, "must be an IP address such as 198.51.100.1"},
		{"0.0.0.0 is refused", `{address: 0.0.0.0, peerASN: 64496, myASN: 64497}`,
			"spec.address: Invalid value: \"0.0.0.0\": 0.0.0.0 and :: name no router: give the router's own address, such as 198.51.100.1"},
		{":: is refused", `{address: "::", peerASN: 64496, myASN: 64497}`, "0.0.0.0 and :: name no router"},
		{"an IPv4 loopback address is refused", `{address: 127.0.0.1, peerASN: 64496, myASN: 64497}`,
			"spec.address: Invalid value: \"127.0.0.1\": a loopback address is the node itself, not a router: give the router's address on the node network"},
		{"the IPv6 loopback address is refused", `{address: "::1", peerASN: 64496, myASN: 64497}`, "a loopback address is the node itself"},
		{"an IPv6 link-local address is refused", `{address: "fe80::1", peerASN: 64496, myASN: 64497}`,
			"spec.address: Invalid value: \"fe80::1\": a link-local address (169.254.0.0/16, fe80::/10) is the router's on one link only: for BGP unnumbered give interface instead of address, else a global or unique-local address of the router"},
		{"an IPv4 link-local address is refused", `{address: 169.254.0.1, peerASN: 64496, myASN: 64497}`, "for BGP unnumbered give interface instead of address"},
		{"an IPv4 multicast address is refused", `{address: 224.0.0.5, peerASN: 64496, myASN: 64497}`,
			"spec.address: Invalid value: \"224.0.0.5\": a multicast or broadcast address (224.0.0.0/4, 255.0.0.0/8, ff00::/8) names no router: give the router's unicast address, such as 198.51.100.1"},
		{"an IPv6 multicast address is refused", `{address: "ff02::1", peerASN: 64496, myASN: 64497}`, "a multicast or broadcast address (224.0.0.0/4, 255.0.0.0/8, ff00::/8) names no router"},
		{"the IPv4 broadcast address is refused", `{address: 255.255.255.255, peerASN: 64496, myASN: 64497}`, "a multicast or broadcast address (224.0.0.0/4, 255.0.0.0/8, ff00::/8) names no router"},
		{"an address in 255.0.0.0/8 is refused", `{address: 255.1.2.3, peerASN: 64496, myASN: 64497}`, "a multicast or broadcast address (224.0.0.0/4, 255.0.0.0/8, ff00::/8) names no router"},
		{"a missing ASN is refused", `{address: 198.51.100.1, myASN: 64497}`, "peerASN: Required value"},
		{"an ASN out of range is refused", `{address: 198.51.100.1, peerASN: 4294967296, myASN: 64497}`, "peerASN"},
		{"a hold time of 2 is refused", `{` + peer + `, holdTimeSeconds: 2}`, "must be 0 or at least 3"},
		{"a keepalive over a third of the hold time is refused", `{` + peer + `, holdTimeSeconds: 9, keepaliveSeconds: 4}`,
			"spec: Invalid value: keepaliveSeconds must be at most a third of holdTimeSeconds, such as holdTimeSeconds: 90 with keepaliveSeconds: 30"},
		{"a keepalive equal to the hold time is refused", `{` + peer + `, holdTimeSeconds: 9, keepaliveSeconds: 9}`, "keepaliveSeconds must be at most a third of holdTimeSeconds"},
		{"a keepalive over a third of the default hold time is refused", `{` + peer + `, keepaliveSeconds: 31}`,
			"spec: Invalid value: keepaliveSeconds must be at most a third of the hold time, 90 by default: give at most 30, or set holdTimeSeconds to at least three times it"},
		{"a keepalive of the default hold time is refused", `{` + peer + `, keepaliveSeconds: 90}`, "at most a third of the hold time, 90 by default"},
		{"a keepalive with hold time 0 is refused", `{` + peer + `, holdTimeSeconds: 0, keepaliveSeconds: 10}`,
			"spec: Invalid value: holdTimeSeconds 0 takes no keepaliveSeconds: remove keepaliveSeconds, or set holdTimeSeconds to at least three times it"},
		{"BFD with multihop is refused", `{` + peer + `, ebgpMultihop: 3, bfd: {enabled: true}}`, "single-hop"},
		{"a source address and a connect retry are accepted", `{` + peer + `, sourceAddress: 198.51.100.11, connectRetrySeconds: 2}`, ""},
		{"a source address that is no address is refused", `{` + peer + `, sourceAddress: eth0}`, "must be an IP address such as 198.51.100.11"},
		{"a link-local source address is refused", `{` + peer + `, sourceAddress: 169.254.0.1}`, "must be a unicast address of a node"},
		{"an unnumbered peer (interface, no address) is accepted", `{interface: eth1, peerASN: 64496, myASN: 64497, bfd: {enabled: true}}`, ""},
		{"neither address nor interface is refused", `{peerASN: 64496, myASN: 64497}`, "give the router's address, or the interface of an unnumbered session, not both"},
		{"address and interface together are refused", `{` + peer + `, interface: eth1}`, "give the router's address, or the interface of an unnumbered session, not both"},
		{"an interface name with a slash is refused", `{interface: "eth/1", peerASN: 64496, myASN: 64497}`, "an interface name is 1 to 15 ASCII characters"},
		{"an interface name over 15 characters is refused", `{interface: a-very-long-name0, peerASN: 64496, myASN: 64497}`, "spec.interface: Too long"},
		{"an unnumbered peer with a source address is refused", `{interface: eth1, peerASN: 64496, myASN: 64497, sourceAddress: 198.51.100.11}`, "remove sourceAddress and ebgpMultihop"},
		{"an unnumbered multihop peer is refused", `{interface: eth1, peerASN: 64496, myASN: 64497, ebgpMultihop: 2}`, "remove sourceAddress and ebgpMultihop"},
		{"a source address of the other family is refused", `{` + peer + `, sourceAddress: "2001:db8:1::11"}`, "sourceAddress must be of the address family of address"},
		{"a connect retry of 0 is refused", `{` + peer + `, connectRetrySeconds: 0}`, "connectRetrySeconds"},
		{"a BFD interval under 10ms is refused", `{` + peer + `, bfd: {enabled: true, minRxMilliseconds: 1}}`, "minRxMilliseconds"},
		{"a password Secret in a badly named namespace is refused", `{` + peer + `, passwordSecretRef: {namespace: Kube_System, name: bgp, key: password}}`,
			"spec.passwordSecretRef.namespace: Invalid value: \"Kube_System\": must be a namespace name: lower-case letters, digits and '-', such as kube-system"},
		{"a badly named password Secret is refused", `{` + peer + `, passwordSecretRef: {namespace: kube-system, name: BGP, key: password}}`,
			"spec.passwordSecretRef.name: Invalid value: \"BGP\": must be a Secret name: lower-case letters, digits, '-' and '.', such as bgp-password"},
		{"a bad password Secret key is refused", `{` + peer + `, passwordSecretRef: {namespace: kube-system, name: bgp, key: "pass word"}}`,
			"spec.passwordSecretRef.key: Invalid value: \"pass word\": must be a Secret key: letters, digits, '-', '_' and '.', such as password"},
	}
	for _, sc := range selectorCases {
		want := sc.want
		if want != "" {
			want = "spec.nodeSelector" + sc.want
		}
		cases = append(cases, crdCase{"spec.nodeSelector: " + sc.name, `{` + peer + `, nodeSelector: ` + sc.spec + `}`, want})
	}
	checkCRDCases(t, dyn, "BGPPeer", "peer", cases, func(t *testing.T, got *unstructured.Unstructured) {
		for _, e := range peerParseErrors(context.Background(), speaker, got) {
			t.Errorf("the API server accepted it, but %v", e)
		}
	})
}

// validatingSpeaker is a real BGP speaker of the agent that dials nobody: it listens on
// loopback and its peers are passive, so giving it peers runs the agent's own peer
// validation and sends nothing.
type validatingSpeaker struct{ s *bgp.Speaker }

func newValidatingSpeaker(t *testing.T) *validatingSpeaker {
	t.Helper()
	s, err := bgp.New(context.Background(), bgp.Config{
		RouterID: netip.MustParseAddr("198.51.100.10"), ASN: 64497,
		ListenPort: int32(testenv.FreePort(t)), ListenAddresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shut the speaker down: %v", err)
		}
	})
	return &validatingSpeaker{s}
}

// peerParseErrors lists what the CCM (its one decoder) and the agent would refuse in an
// accepted peer. The session the CCM sends is converted to the speaker's peer as the agent
// converts it (nodeagent's bgpPeers), passive so that nothing is dialled; the password is
// left out (it comes from a Secret).
func peerParseErrors(ctx context.Context, v *validatingSpeaker, u *unstructured.Unstructured) []error {
	p := pools.DecodePeer(u)
	var errs []error
	for _, pr := range p.Problems {
		errs = append(errs, fmt.Errorf("the CCM refuses %s", pr))
	}
	if len(errs) > 0 {
		return errs
	}
	s := p.Session
	var addr netip.Addr
	var err error
	if s.GetInterface() == "" {
		if addr, err = netip.ParseAddr(s.GetAddress()); err != nil {
			return append(errs, fmt.Errorf("the agent cannot parse address %q: %w", s.GetAddress(), err))
		}
	}
	bp := bgp.Peer{
		Address:         addr,
		Interface:       s.GetInterface(),
		Port:            uint16(s.GetPort()),
		PeerASN:         s.GetPeerAsn(),
		LocalASN:        s.GetLocalAsn(),
		HoldTime:        time.Duration(s.GetHoldTimeSeconds()) * time.Second,
		Keepalive:       time.Duration(s.GetKeepaliveSeconds()) * time.Second,
		MultihopTTL:     uint8(s.GetEbgpMultihopTtl()),
		GracefulRestart: s.GetGracefulRestart(),
		ConnectRetry:    time.Duration(s.GetConnectRetrySeconds()) * time.Second,
		BFD: bgp.BFD{
			Enabled:    s.GetBfd().GetEnabled(),
			MinRx:      time.Duration(s.GetBfd().GetMinRxMs()) * time.Millisecond,
			MinTx:      time.Duration(s.GetBfd().GetMinTxMs()) * time.Millisecond,
			Multiplier: s.GetBfd().GetMultiplier(),
		},
		Passive: true,
	}
	if src := s.GetSourceAddress(); src != "" {
		if bp.SourceAddress, err = netip.ParseAddr(src); err != nil {
			errs = append(errs, fmt.Errorf("the agent cannot parse source address %q: %w", src, err))
		}
	}
	if s.GetPort() > 65535 || s.GetEbgpMultihopTtl() > 255 {
		errs = append(errs, fmt.Errorf("the agent refuses port %d or multihop TTL %d", s.GetPort(), s.GetEbgpMultihopTtl()))
	}
	if bp.Interface != "" {
		// An unnumbered peer is checked, not set: setting it would solicit the neighbours of
		// a host interface of that name, and it cannot be passive.
		bp.Passive = false
		if err := bgp.CheckPeer(64497, bp); err != nil {
			errs = append(errs, fmt.Errorf("the agent's BGP speaker refuses it: %w", err))
		}
		return errs
	}
	if err := v.s.SetPeers(ctx, []bgp.Peer{bp}); err != nil {
		errs = append(errs, fmt.Errorf("the agent's BGP speaker refuses it: %w", err))
	}
	if err := v.s.SetPeers(ctx, nil); err != nil {
		errs = append(errs, fmt.Errorf("remove the peer again: %w", err))
	}
	return errs
}

// genPeerAddress is mostly a router's address, sometimes one that names no router.
var genPeerAddress = mostly(
	rapid.Custom(func(t *rapid.T) string {
		if rapid.Bool().Draw(t, "v6") {
			return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: rapid.Byte().Draw(t, "host")}).String()
		}
		return netip.AddrFrom4([4]byte{198, 51, 100, rapid.Byte().Draw(t, "host")}).String()
	}),
	rapid.OneOf(
		rapid.SampledFrom([]string{"0.0.0.0", "::", "127.0.0.1", "::1", "fe80::1", "169.254.0.1", "224.0.0.5", "ff02::1", "255.255.255.255",
			"::ffff:198.51.100.1", "fe80::1%eth0", "198.51.100.300", "router", "255.1.2.3", "240.0.0.1"}),
		rapid.Custom(func(t *rapid.T) string { return genAddr(t, "any").String() })))

// genInterfaceName is mostly a network interface's name, sometimes one that cannot be.
var genInterfaceName = mostly(
	rapid.OneOf(rapid.SampledFrom([]string{"eth1", "bond0.100", "enp0s31f6", "swp1", "a-15-char-name0"}), rapid.StringMatching(`[a-z][a-z0-9.-]{0,14}`)),
	rapid.SampledFrom([]string{"", ".", "..", "eth/1", "eth1:0", "eth 1", "a-very-long-name0", "é", "eth\t1"}))

// TestPeersTheCRDAcceptsAreAcceptedByTheCCMAndTheAgent generates peers, near-valid and not, and
// submits them to the real API server: every peer it accepts must be taken by the agent's
// own BGP speaker, converted as the CCM and the agent convert it.
func TestPeersTheCRDAcceptsAreAcceptedByTheCCMAndTheAgent(t *testing.T) {
	dyn := kubeapi.Get(t).InstallCRDs(t)
	speaker := newValidatingSpeaker(t)
	asn := mostly(rapid.OneOf(rapid.SampledFrom([]int64{1, 64496, 65535, 4294967295}), rapid.Int64Range(1, 4294967295)), rapid.SampledFrom([]int64{0, -1, 4294967296}))
	checkCRDParity(t, dyn, "BGPPeer", func(rt *rapid.T) map[string]any {
		spec := map[string]any{"peerASN": asn.Draw(rt, "peerASN"), "myASN": asn.Draw(rt, "myASN")}
		// Mostly a numbered peer; sometimes unnumbered (an interface), rarely both or neither.
		switch rapid.IntRange(0, 9).Draw(rt, "session") {
		case 0, 1:
			spec["interface"] = genInterfaceName.Draw(rt, "interface")
		case 2:
			spec["interface"] = genInterfaceName.Draw(rt, "interface")
			spec["address"] = genPeerAddress.Draw(rt, "address")
		case 3:
		default:
			spec["address"] = genPeerAddress.Draw(rt, "address")
		}
		optional := func(name string, g *rapid.Generator[int64]) {
			if rapid.Bool().Draw(rt, "has "+name) {
				spec[name] = g.Draw(rt, name)
			}
		}
		optional("port", mostly(rapid.Int64Range(1, 65535), rapid.SampledFrom([]int64{0, 65536})))
		optional("holdTimeSeconds", mostly(rapid.OneOf(rapid.SampledFrom([]int64{0, 3, 9, 90, 65535}), rapid.Int64Range(3, 65535)), rapid.SampledFrom([]int64{1, 2, 65536})))
		optional("keepaliveSeconds", rapid.OneOf(rapid.SampledFrom([]int64{0, 1, 3, 30, 31, 90, 21845}), rapid.Int64Range(0, 100)))
		optional("ebgpMultihop", mostly(rapid.Int64Range(1, 255), rapid.SampledFrom([]int64{0, 256})))
		if rapid.Bool().Draw(rt, "has bfd") {
			bfd := map[string]any{"enabled": rapid.Bool().Draw(rt, "bfd enabled")}
			interval := mostly(rapid.OneOf(rapid.SampledFrom([]int64{10, 300, 60000}), rapid.Int64Range(10, 60000)), rapid.SampledFrom([]int64{1, 9, 60001}))
			for _, f := range []string{"minRxMilliseconds", "minTxMilliseconds"} {
				if rapid.Bool().Draw(rt, "has "+f) {
					bfd[f] = interval.Draw(rt, f)
				}
			}
			if rapid.Bool().Draw(rt, "has multiplier") {
				bfd["multiplier"] = mostly(rapid.Int64Range(2, 255), rapid.SampledFrom([]int64{0, 1, 256})).Draw(rt, "multiplier")
			}
			spec["bfd"] = bfd
		}
		spec["gracefulRestart"] = rapid.Bool().Draw(rt, "gracefulRestart")
		spec["ttlSecurity"] = rapid.Bool().Draw(rt, "ttlSecurity")
		if rapid.Bool().Draw(rt, "has nodeSelector") {
			spec["nodeSelector"] = genSelector(rt, "nodeSelector")
		}
		return spec
	}, func(rt *rapid.T, spec map[string]any, got *unstructured.Unstructured) {
		if errs := peerParseErrors(context.Background(), speaker, got); len(errs) > 0 {
			rt.Fatalf("the API server accepted %v, but %v", spec, errors.Join(errs...))
		}
	})
}
