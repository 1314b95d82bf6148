package bgp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var testConfig = Config{RouterID: netip.MustParseAddr("198.51.100.11"), ASN: 64497, ListenPort: -1}

func TestPeerValidation(t *testing.T) {
	router := netip.MustParseAddr("198.51.100.1")
	ok := Peer{Address: router, PeerASN: 64496}
	tests := []struct {
		name      string
		peer      func(p *Peer)
		wantField string
		wantErr   string
	}{
		{"a peer with an address and an ASN is valid", func(*Peer) {}, "", ""},
		{"a peer without an address is refused", func(p *Peer) { p.Address = netip.Addr{} }, "Address", "give the peer's IP address"},
		{"a peer without an ASN is refused", func(p *Peer) { p.PeerASN = 0 }, "PeerASN", "give the peer's AS number"},
		{"a link-local peer is refused", func(p *Peer) { p.Address = netip.MustParseAddr("fe80::1") }, "Address", "link-local"},
		{"a zoned peer is refused", func(p *Peer) { p.Address = netip.MustParseAddr("fe80::1%eth0") }, "Address", "link-local"},
		{"an IPv4 link-local peer is refused", func(p *Peer) { p.Address = netip.MustParseAddr("169.254.0.1") }, "Address", "link-local"},
		{"a multicast peer is refused", func(p *Peer) { p.Address = netip.MustParseAddr("224.0.0.5") }, "Address", "not a unicast address"},
		{"the unspecified address is refused", func(p *Peer) { p.Address = netip.MustParseAddr("0.0.0.0") }, "Address", "not a unicast address"},
		{"the IPv6 unspecified address is refused", func(p *Peer) { p.Address = netip.MustParseAddr("::") }, "Address", "not a unicast address"},
		{"a fractional hold time is refused", func(p *Peer) { p.HoldTime = 1500 * time.Millisecond }, "HoldTime", "whole seconds from 3s"},
		{"a hold time under 3s is refused", func(p *Peer) { p.HoldTime = 2 * time.Second }, "HoldTime", "whole seconds from 3s to 65535s"},
		{"a hold time over 65535s is refused", func(p *Peer) { p.HoldTime = 65536 * time.Second }, "HoldTime", "to 65535s"},
		{"a keepalive as long as the hold time is refused", func(p *Peer) { p.HoldTime, p.Keepalive = 9*time.Second, 9*time.Second }, "Keepalive", "not shorter than the hold time 9s"},
		{"a keepalive as long as the default hold time is refused", func(p *Peer) { p.Keepalive = 90 * time.Second }, "Keepalive", "not shorter than the hold time 1m30s"},
		{"a passive peer needs a listening speaker", func(p *Peer) { p.Passive = true }, "Passive", "does not listen"},
		{"BFD with multihop is refused", func(p *Peer) { p.MultihopTTL = 2; p.BFD.Enabled = true }, "BFD.Enabled", "single hop"},
		{"a BFD interval under 1ms is refused", func(p *Peer) { p.BFD = BFD{Enabled: true, MinRx: 500 * time.Microsecond} }, "BFD.MinRx", "from 1ms to 1m"},
		{"a BFD multiplier over 255 is refused", func(p *Peer) { p.BFD = BFD{Enabled: true, Multiplier: 256} }, "BFD.Multiplier", "1 to 255"},
		{"disabled BFD settings are ignored", func(p *Peer) { p.BFD = BFD{MinRx: time.Nanosecond} }, "", ""},
		{"TTL security with multihop is valid", func(p *Peer) { p.MultihopTTL, p.TTLSecurity = 2, true }, "", ""},
		{"an unnumbered peer (an interface, no address) is valid", func(p *Peer) { p.Address, p.Interface = netip.Addr{}, "eth1" }, "", ""},
		{"an unnumbered peer with BFD and TTL security is valid", func(p *Peer) {
			p.Address, p.Interface, p.TTLSecurity, p.BFD.Enabled = netip.Addr{}, "eth1", true, true
		}, "", ""},
		{"an interface and an address are refused", func(p *Peer) { p.Interface = "eth1" }, "Address", "give one of the two"},
		{"an interface name with a slash is refused", func(p *Peer) { p.Address, p.Interface = netip.Addr{}, "eth/1" }, "Interface", "not an interface name"},
		{"an interface name over 15 bytes is refused", func(p *Peer) { p.Address, p.Interface = netip.Addr{}, "a-very-long-name0" }, "Interface", "1 to 15 ASCII characters"},
		{"an unnumbered peer with a source address is refused", func(p *Peer) {
			p.Address, p.Interface, p.SourceAddress = netip.Addr{}, "eth1", netip.MustParseAddr("198.51.100.11")
		}, "SourceAddress", "link-local address on eth1"},
		{"an unnumbered multihop peer is refused", func(p *Peer) { p.Address, p.Interface, p.MultihopTTL = netip.Addr{}, "eth1", 2 }, "MultihopTTL", "one hop away"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.peer(&p)
			_, err := normalizePeers(testConfig, []Peer{p})
			checkErr(t, err, tt.wantErr)
			// CheckPeer gives the same verdict, with the field at fault.
			cerr := CheckPeer(testConfig.ASN, p)
			var fe *FieldError
			switch {
			case tt.wantField == "" && cerr != nil:
				t.Errorf("CheckPeer = %v; want nil", cerr)
			case tt.wantField != "" && (!errors.As(cerr, &fe) || fe.Field != tt.wantField):
				t.Errorf("CheckPeer = %v; want a FieldError on %s", cerr, tt.wantField)
			}
		})
	}
}

func TestAPeerWithoutALocalASNIsRefusedWhenTheSpeakerHasNone(t *testing.T) {
	p := Peer{Address: netip.MustParseAddr("198.51.100.1"), PeerASN: 64496}
	var fe *FieldError
	if err := CheckPeer(0, p); !errors.As(err, &fe) || fe.Field != "LocalASN" {
		t.Errorf("CheckPeer with no ASN = %v; want a FieldError on LocalASN", err)
	}
	p.LocalASN = 64497
	if err := CheckPeer(0, p); err != nil {
		t.Errorf("CheckPeer with the peer's own local ASN = %v", err)
	}
}

func TestPeerDefaults(t *testing.T) {
	got, err := normalizePeers(testConfig, []Peer{{
		Address: netip.MustParseAddr("::ffff:198.51.100.1"), PeerASN: 64496, BFD: BFD{Enabled: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := got[netip.MustParseAddr("198.51.100.1")]
	if !ok {
		t.Fatalf("an IPv4-mapped address is not keyed by its IPv4 form: %v", got)
	}
	if p.LocalASN != testConfig.ASN {
		t.Errorf("LocalASN = %d, want the speaker's %d", p.LocalASN, testConfig.ASN)
	}
	if want := (BFD{Enabled: true, MinRx: 300 * time.Millisecond, MinTx: 300 * time.Millisecond, Multiplier: 3}); p.BFD != want {
		t.Errorf("BFD = %+v, want %+v", p.BFD, want)
	}
}

func TestTheSamePeerTwiceIsRefused(t *testing.T) {
	a := Peer{Address: netip.MustParseAddr("198.51.100.1"), PeerASN: 64496}
	b := a
	b.Address = netip.MustParseAddr("::ffff:198.51.100.1")
	_, err := normalizePeers(testConfig, []Peer{a, b})
	checkErr(t, err, "listed twice")

	// One unnumbered session per interface; another interface is another peer.
	u := Peer{Interface: "eth1", PeerASN: 64496}
	_, err = normalizePeers(testConfig, []Peer{u, u})
	checkErr(t, err, "peer interface eth1: listed twice")
	v := u
	v.Interface = "eth2"
	got, err := normalizePeers(testConfig, []Peer{a, u, v})
	if err != nil || len(got) != 3 {
		t.Fatalf("a numbered peer and unnumbered ones on two interfaces: %v, %v", got, err)
	}
}

func TestRouteValidation(t *testing.T) {
	tests := []struct {
		name    string
		route   Route
		wantErr string
	}{
		{"an IPv4 /32 is valid", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32")}, ""},
		{"an IPv6 /128 is valid", Route{Prefix: netip.MustParsePrefix("2001:db8:100::10/128")}, ""},
		{"communities and local preference are valid", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"64497:100", "0:65535"}, LocalPref: 200}, ""},
		{"an aggregate /24 (a ClusterIP range) is valid", Route{Prefix: netip.MustParsePrefix("203.0.113.0/24")}, ""},
		{"an aggregate /64 is valid", Route{Prefix: netip.MustParsePrefix("2001:db8:100::/64")}, ""},
		{"a prefix with bits after its length is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.7/24")}, "want 203.0.113.0/24"},
		{"a weight above the maximum is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Weight: MaxWeight + 1}, "weight"},
		{"no prefix is refused", Route{}, "invalid prefix"},
		{"an IPv4-mapped prefix is refused", Route{Prefix: netip.MustParsePrefix("::ffff:203.0.113.10/128")}, "IPv4-mapped"},
		{"a loopback VIP is refused", Route{Prefix: netip.MustParsePrefix("127.0.0.1/32")}, "unicast"},
		{"a community without a colon is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"64497"}}, `community "64497": want ASN:value`},
		{"a community ASN over 65535 is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"65536:1"}}, "ASN part"},
		{"a community value over 65535 is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"1:65536"}}, "value part"},
		{"a negative community is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"-1:1"}}, "ASN part"},
		{"a large community is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), Communities: []string{"1:2:3"}}, "value part"},
		{"large communities are valid", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), LargeCommunities: []string{"4200000000:1:2", "0:0:4294967295"}}, ""},
		{"a large community with two parts is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), LargeCommunities: []string{"1:2"}}, "want ASN:value1:value2"},
		{"a large community part over 32 bits is refused", Route{Prefix: netip.MustParsePrefix("203.0.113.10/32"), LargeCommunities: []string{"4294967296:1:2"}}, "0 to 4294967295"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := normalizeRoutes([]Route{tt.route})
			checkErr(t, err, tt.wantErr)
		})
	}
}

func TestRoutesCompareByWhatTheyAnnounce(t *testing.T) {
	p := netip.MustParsePrefix("203.0.113.10/32")
	a, err := normalizeRoute(Route{Prefix: p, Communities: []string{"1:2", "3:4", "1:2"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := normalizeRoute(Route{Prefix: p, Communities: []string{"3:4", "1:2"}})
	if !a.equal(b) {
		t.Errorf("community order or repetition changed the route: %+v vs %+v", a, b)
	}
	c, _ := normalizeRoute(Route{Prefix: p, Communities: []string{"3:4", "1:2"}, LocalPref: 50})
	if a.equal(c) {
		t.Error("a new local preference did not change the route")
	}
	if _, err := normalizeRoutes([]Route{{Prefix: p}, {Prefix: p, LocalPref: 1}}); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("the same prefix twice: err = %v, want listed twice", err)
	}
}

func TestCommunityRoundTrip(t *testing.T) {
	for _, s := range []string{"0:0", "64497:100", "65535:65535"} {
		v, err := ParseCommunity(s)
		if err != nil {
			t.Fatalf("ParseCommunity(%q): %v", s, err)
		}
		if got := FormatCommunity(v); got != s {
			t.Errorf("FormatCommunity(ParseCommunity(%q)) = %q", s, got)
		}
	}
	if v, _ := ParseCommunity("64497:100"); v != 64497<<16|100 {
		t.Errorf("ParseCommunity(64497:100) = %#x", v)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"an IPv4 router ID and an ASN are enough", Config{RouterID: netip.MustParseAddr("198.51.100.11"), ASN: 1}, ""},
		{"an IPv6 router ID is refused", Config{RouterID: netip.MustParseAddr("2001:db8::1"), ASN: 1}, "IPv4"},
		{"ASN 0 is refused", Config{RouterID: netip.MustParseAddr("198.51.100.11")}, "ASN is 0"},
		{"a listen port over 65535 is refused", Config{RouterID: netip.MustParseAddr("198.51.100.11"), ASN: 1, ListenPort: 70000}, "listen port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, tt.cfg.validate(), tt.wantErr)
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Errorf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("error %q does not contain %q", err, want)
	}
}

func TestLargeCommunitiesCompareAsSets(t *testing.T) {
	p := netip.MustParsePrefix("203.0.113.10/32")
	a, err := normalizeRoute(Route{Prefix: p, LargeCommunities: []string{"4200000000:1:2", "64496:0:7", "64496:0:7"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := normalizeRoute(Route{Prefix: p, LargeCommunities: []string{"64496:0:7", "4200000000:1:2"}})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := normalizeRoute(Route{Prefix: p, LargeCommunities: []string{"64496:0:7"}})
	if !a.equal(b) || a.equal(c) || len(a.largeValues) != 2 {
		t.Errorf("a %+v, b %+v, c %+v", a, b, c)
	}
}
