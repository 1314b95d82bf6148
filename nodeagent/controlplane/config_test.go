package controlplane

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Three valid X25519 public keys.
const (
	key1 = "W4Cb7PBXxJ5l3gMIKevoZUv8/t+0AMwmeRAKGu6yOnw="
	key2 = "GOsrAm2Md56x9qCv7SD8TD4Z1+DKvNc+D0TWD1LnOXc="
	key3 = "7aPEQociCtCMiWUee4Ol1xnTa5fgv9TJceUjmveZDRo="
)

const l2File = `apiVersion: metalvip.io/v1alpha1
kind: ControlPlane
node: cp2
vip: 203.0.113.10
mode: L2
nodes:
- {name: cp1, address: 198.51.100.11, heartbeatKey: "` + key1 + `"}
- {name: cp2, address: 198.51.100.12, heartbeatKey: "` + key2 + `", priority: 10}
- {name: cp3, address: 198.51.100.13, heartbeatKey: "` + key3 + `"}
`

func TestAValidFileGetsItsDefaultsAndItsRanking(t *testing.T) {
	s, err := Parse([]byte(l2File))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Names(), []string{"cp2", "cp1", "cp3"}; !slices.Equal(got, want) {
		t.Errorf("ranking %v, want %v (priority first, then name)", got, want)
	}
	if s.Self.Name != "cp2" || s.Self.Addr != netip.MustParseAddr("198.51.100.12") || len(s.Self.Key) != 32 {
		t.Errorf("self %+v", s.Self)
	}
	if s.Majority() != 2 || len(s.Others()) != 2 {
		t.Errorf("majority %d, others %v", s.Majority(), s.Others())
	}
	h := s.Health
	if h.URL != "https://198.51.100.12:6443/readyz" || h.CAFile != DefaultCAFile || h.Interval != 100*time.Millisecond ||
		h.Timeout != time.Second || h.Rise != 3 || h.Fall != 2 {
		t.Errorf("health defaults %+v", h)
	}
	if s.QuorumPort != 7474 || s.CandidatePort != 7475 || s.Interval != 50*time.Millisecond || s.Misses != 3 {
		t.Errorf("heartbeat defaults %d %d %s %d", s.QuorumPort, s.CandidatePort, s.Interval, s.Misses)
	}
}

func TestABGPFileGivesItsPeersWithTheLocalASN(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Parse([]byte(`apiVersion: metalvip.io/v1alpha1
kind: ControlPlane
node: cp1
vip: 203.0.113.10
mode: BGP
nodes: [{name: cp1, address: 198.51.100.11}]
bgp:
  asn: 64497
  peers:
  - {address: 198.51.100.1, peerASN: 64496, bfd: {minRxMs: 100, minTxMs: 100}, passwordFile: ` + pw + `}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Peers) != 1 || s.Peers[0].LocalASN != 64497 || s.Peers[0].Password != "s3cret" || !s.Peers[0].BFD.Enabled || s.Peers[0].BFD.MinRx != 100*time.Millisecond {
		t.Errorf("peers %+v", s.Peers)
	}
}

func TestAFileWithMistakesIsRefusedNamingEachField(t *testing.T) {
	base := func(edit func(string) string) string { return edit(l2File) }
	for _, tc := range []struct {
		name string
		file string
		want []string
	}{
		{"a misspelt field is refused, not ignored", base(func(s string) string { return s + "bootsrap: true\n" }), []string{`unknown field "bootsrap"`}},
		{"another kind is refused", base(func(s string) string { return strings.Replace(s, "kind: ControlPlane", "kind: Pod", 1) }), []string{"apiVersion/kind"}},
		{"a VIP that is no address is refused", base(func(s string) string { return strings.Replace(s, "203.0.113.10", "203.0.113", 1) }), []string{"vip:"}},
		{"a loopback VIP is refused", base(func(s string) string { return strings.Replace(s, "203.0.113.10", "127.0.0.1", 1) }), []string{"vip: 127.0.0.1 is not a unicast"}},
		{"an unknown mode is refused", base(func(s string) string { return strings.Replace(s, "mode: L2", "mode: ARP", 1) }), []string{"mode:"}},
		{"a node that is not listed is refused", base(func(s string) string { return strings.Replace(s, "node: cp2", "node: cp9", 1) }), []string{"node: \"cp9\" is not one of nodes"}},
		{"a node listed twice is refused", base(func(s string) string { return strings.Replace(s, "name: cp3", "name: cp1", 1) }), []string{"nodes[2].name: \"cp1\" is also nodes[0]"}},
		{"an address listed twice is refused", base(func(s string) string { return strings.Replace(s, "198.51.100.13", "198.51.100.11", 1) }), []string{"nodes[2].address: 198.51.100.11 is also nodes[0]"}},
		{"the VIP as a node's address is refused", base(func(s string) string { return strings.Replace(s, "198.51.100.13", "203.0.113.10", 1) }), []string{"nodes[2].address: 203.0.113.10 is the VIP"}},
		{"a node of the other family is refused", base(func(s string) string { return strings.Replace(s, "198.51.100.13", "2001:db8::13", 1) }), []string{"nodes[2].address: 2001:db8::13 is not of the VIP's family"}},
		{"a key that is not base64 is refused", base(func(s string) string { return strings.Replace(s, key3, "not-a-key", 1) }), []string{"nodes[2].heartbeatKey"}},
		{"a key of the wrong size is refused", base(func(s string) string { return strings.Replace(s, key3, "AAAA", 1) }), []string{"nodes[2].heartbeatKey: not an X25519 public key"}},
		{"a missing key in L2 mode is refused", base(func(s string) string { return strings.Replace(s, `, heartbeatKey: "`+key3+`"`, "", 1) }), []string{"nodes[2].heartbeatKey: missing"}},
		{"the same port twice is refused", base(func(s string) string { return s + "heartbeat: {quorumPort: 7000, candidatePort: 7000}\n" }), []string{"heartbeat.candidatePort: 7000 is also the quorum port"}},
		{"a heartbeat too fast is refused", base(func(s string) string { return s + "heartbeat: {interval: 1ms}\n" }), []string{"heartbeat.interval: 1ms is out of range"}},
		{"a fall of zero checks is taken as the default, a negative one refused", base(func(s string) string { return s + "apiServer: {fall: -1}\n" }), []string{"apiServer.fall: -1"}},
		{"a readiness URL that is not http is refused", base(func(s string) string { return s + "apiServer: {url: \"ftp://x/readyz\"}\n" }), []string{"apiServer.url"}},
		// Issue 30, fault 7: a check through the VIP passes only while some node holds it.
		{"a readiness URL through the VIP itself is refused", base(func(s string) string { return s + "apiServer: {url: \"https://203.0.113.10:6443/readyz\"}\n" }), []string{"apiServer.url", "through the VIP itself"}},
		{"a plain-http readiness URL to another host is refused", base(func(s string) string { return s + "apiServer: {url: \"http://198.51.100.11:8080/readyz\"}\n" }), []string{"apiServer.url", "plain http"}},
		{"BGP settings in L2 mode are refused", base(func(s string) string { return s + "bgp: {asn: 64497, peers: []}\n" }), []string{"bgp: given in L2 mode"}},
		{"BGP mode without routers is refused", base(func(s string) string { return strings.Replace(s, "mode: L2", "mode: BGP", 1) }), []string{"bgp.peers: empty"}},
		{"a router without its ASN is refused", base(func(s string) string {
			return strings.Replace(s, "mode: L2", "mode: BGP", 1) + "bgp: {asn: 64497, peers: [{address: 198.51.100.1}]}\n"
		}), []string{"bgp.peers[0].peerASN: missing"}},
		{"a password file that cannot be read is refused", base(func(s string) string {
			return strings.Replace(s, "mode: L2", "mode: BGP", 1) + "bgp: {asn: 64497, peers: [{address: 198.51.100.1, peerASN: 64496, passwordFile: /nonexistent/pw}]}\n"
		}), []string{"bgp.peers[0].passwordFile"}},
		{"every mistake is reported at once", base(func(s string) string {
			return strings.Replace(strings.Replace(s, "203.0.113.10", "x", 1), "mode: L2", "mode: y", 1)
		}), []string{"vip:", "mode:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestAConfigWrittenByEncodeReadsBack(t *testing.T) {
	c, err := Decode([]byte(l2File))
	if err != nil {
		t.Fatal(err)
	}
	data, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	o, _ := Parse([]byte(l2File))
	if !s.SameHeartbeats(o) || s.VIP != o.VIP {
		t.Errorf("read back differs:\n%s", data)
	}
}
