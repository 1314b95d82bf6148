// Package controlplane reads the local file of metalvip-agent's standalone mode: the
// control-plane VIP in front of the kube-apiservers (kubeadm's --control-plane-endpoint), the
// control-plane nodes with their addresses, ranks and heartbeat keys, how the VIP is announced
// (ARP/NDP or BGP) and the timers; and it follows the local kube-apiserver's /readyz with
// hysteresis (health.go). It decides nothing on the wire (nodeagent/standalone.go does) and
// needs no API server, no kubeconfig and no CCM: the first control-plane node brings the VIP
// up before `kubeadm init` has an API server. It reads only its file, a CA file and /readyz.
package controlplane

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/failover"
)

// The file's type.
const (
	APIVersion = "metalvip.io/v1alpha1"
	Kind       = "ControlPlane"
)

// Defaults, and the bounds a file may set.
const (
	DefaultQuorumPort    = 7474 // the CCM's heartbeats use 7473
	DefaultCandidatePort = 7475
	DefaultAPIServerPort = 6443
	DefaultCAFile        = "/etc/kubernetes/pki/ca.crt"

	defaultHeartbeatInterval = 50 * time.Millisecond
	defaultHeartbeatMisses   = 3
	defaultProbeInterval     = 100 * time.Millisecond
	defaultProbeTimeout      = time.Second
	defaultRise              = 3
	defaultFall              = 2
)

// Mode is how the control-plane VIP is announced.
type Mode string

// Modes.
const (
	// ModeL2 answers ARP/NDP on one node at a time: the highest-ranked node whose
	// kube-apiserver is ready and that sees a majority of the control-plane nodes.
	ModeL2 Mode = "L2"
	// ModeBGP advertises the VIP from every node whose kube-apiserver is ready (anycast):
	// the routers spread the clients, BFD takes a dead node out, and nothing is elected.
	ModeBGP Mode = "BGP"
)

// Config is the file as written (YAML or JSON). Spec is what it means, checked.
type Config struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Node is this node's name: one of Nodes.
	Node string `json:"node"`
	// VIP is the control-plane endpoint's address.
	VIP  string `json:"vip"`
	Mode Mode   `json:"mode"`
	// Interfaces answer ARP/NDP for the VIP (L2); empty: the agent's --interfaces.
	Interfaces []string `json:"interfaces,omitempty"`
	// Bootstrap is for the first control-plane node, before `kubeadm init`: it may hold the VIP
	// before its kube-apiserver was ever ready, and (L2) without a majority until it has seen
	// one. Both end for good (kept in the state directory) once each has happened.
	Bootstrap bool `json:"bootstrap,omitempty"`
	// Standby keeps this node from holding the VIP (it still counts for the majority): set it
	// before upgrading or draining the node, and the VIP moves to the next ready node.
	Standby   bool      `json:"standby,omitempty"`
	APIServer APIServer `json:"apiServer,omitempty"`
	Heartbeat Heartbeat `json:"heartbeat,omitempty"`
	// Nodes are every control-plane node, the same list on every node.
	Nodes []Node `json:"nodes"`
	// BGP is required in BGP mode.
	BGP *BGP `json:"bgp,omitempty"`
}

// APIServer says how the local kube-apiserver's health is checked.
type APIServer struct {
	// URL of the readiness check; default https://<this node's address>:6443/readyz.
	URL string `json:"url,omitempty"`
	// CAFile verifies the API server's certificate; default /etc/kubernetes/pki/ca.crt. Until
	// it can be read (before `kubeadm init` writes it) the API server counts as not ready.
	CAFile string `json:"caFile,omitempty"`
	// Interval between checks (default 100ms) and Timeout of one (default 1s).
	Interval metav1.Duration `json:"interval,omitempty"`
	Timeout  metav1.Duration `json:"timeout,omitempty"`
	// Rise successes in a row make it ready (default 3); Fall failures in a row not (default 2).
	Rise int `json:"rise,omitempty"`
	Fall int `json:"fall,omitempty"`
}

// Heartbeat sets the UDP heartbeats among control-plane nodes (L2): one exchange on
// QuorumPort among all of them (who sees whom, for the majority), one on CandidatePort among
// the nodes that may hold the VIP now (ready, not standby, with a majority).
type Heartbeat struct {
	QuorumPort    int             `json:"quorumPort,omitempty"`
	CandidatePort int             `json:"candidatePort,omitempty"`
	Interval      metav1.Duration `json:"interval,omitempty"` // default 50ms
	Misses        int             `json:"misses,omitempty"`   // default 3
}

// Node is one control-plane node.
type Node struct {
	Name string `json:"name"`
	// Address is the node's data-plane address: heartbeats come from it, and the default
	// readiness URL uses it.
	Address string `json:"address"`
	// Priority ranks the nodes (higher first, then by name): the highest-ranked ready node
	// holds the VIP (L2). It must be the same on every node's copy of the file.
	Priority int32 `json:"priority,omitempty"`
	// HeartbeatKey is the node's heartbeat public key, base64, as
	// `metalvip-agent --print-heartbeat-key` printed it on that node. Required in L2 mode
	// with more than one node.
	HeartbeatKey string `json:"heartbeatKey,omitempty"`
}

// BGP is the VIP's BGP setup.
type BGP struct {
	// ASN is the local ASN (unless a peer sets its own).
	ASN uint32 `json:"asn,omitempty"`
	// RouterID, an IPv4 address; default the agent's.
	RouterID string    `json:"routerID,omitempty"`
	Peers    []BGPPeer `json:"peers"`
}

// BGPPeer is one router.
type BGPPeer struct {
	Address          string `json:"address"`
	Port             uint16 `json:"port,omitempty"`
	PeerASN          uint32 `json:"peerASN"`
	LocalASN         uint32 `json:"localASN,omitempty"`
	HoldTimeSeconds  uint16 `json:"holdTimeSeconds,omitempty"`
	KeepaliveSeconds uint16 `json:"keepaliveSeconds,omitempty"`
	// PasswordFile holds the TCP MD5 password; the file itself need not be world-readable.
	PasswordFile string `json:"passwordFile,omitempty"`
	EBGPMultihop uint8  `json:"ebgpMultihop,omitempty"`
	TTLSecurity  bool   `json:"ttlSecurity,omitempty"`
	BFD          *BFD   `json:"bfd,omitempty"`
}

// BFD of a BGP peer.
type BFD struct {
	MinRxMs    uint32 `json:"minRxMs,omitempty"`
	MinTxMs    uint32 `json:"minTxMs,omitempty"`
	Multiplier uint32 `json:"multiplier,omitempty"`
}

// Spec is a checked Config, with defaults filled in.
type Spec struct {
	Self       Member
	VIP        netip.Addr
	Mode       Mode
	Interfaces []string
	Bootstrap  bool
	Standby    bool
	Health     Health
	// Members are every control-plane node, best-ranked first.
	Members []Member

	QuorumPort, CandidatePort uint16
	Interval                  time.Duration
	Misses                    int

	ASN      uint32
	RouterID netip.Addr
	Peers    []bgp.Peer
}

// Member is a checked Node.
type Member struct {
	Name     string
	Addr     netip.Addr
	Priority int32
	Key      []byte // nil when none was given
}

// Health is how the local kube-apiserver is checked.
type Health struct {
	URL               string
	CAFile            string
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// Majority is how many control-plane nodes, this one included, must see each other.
func (s *Spec) Majority() int { return len(s.Members)/2 + 1 }

// Others returns every member but this node.
func (s *Spec) Others() []Member {
	return slices.DeleteFunc(slices.Clone(s.Members), func(m Member) bool { return m.Name == s.Self.Name })
}

// Names returns the members' names, best-ranked first.
func (s *Spec) Names() []string {
	out := make([]string, len(s.Members))
	for i, m := range s.Members {
		out[i] = m.Name
	}
	return out
}

// SameHeartbeats reports whether o runs the same heartbeat exchanges as s (then a change from
// s to o needs no new sockets).
func (s *Spec) SameHeartbeats(o *Spec) bool {
	return s.Self.Name == o.Self.Name && s.Mode == o.Mode && s.QuorumPort == o.QuorumPort &&
		s.CandidatePort == o.CandidatePort && s.Interval == o.Interval && s.Misses == o.Misses &&
		slices.EqualFunc(s.Members, o.Members, func(a, b Member) bool {
			return a.Name == b.Name && a.Addr == b.Addr && a.Priority == b.Priority && string(a.Key) == string(b.Key)
		})
}

// Load reads and checks the file at path.
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Decode reads a file's text, refusing unknown fields (a misspelt field must not be ignored).
func Decode(data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("does not parse: %w", err)
	}
	return &c, nil
}

// Encode writes a Config as YAML.
func Encode(c *Config) ([]byte, error) { return yaml.Marshal(c) }

// Parse decodes and checks a file's text. Every mistake is reported, each with its field.
func Parse(data []byte) (*Spec, error) {
	c, err := Decode(data)
	if err != nil {
		return nil, err
	}
	return c.Check()
}

// Check checks the config and fills in the defaults.
func (c *Config) Check() (*Spec, error) {
	var errs []string
	bad := func(field, format string, args ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, args...))
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		bad("apiVersion/kind", "%q/%q; write apiVersion: %s and kind: %s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	s := &Spec{Mode: c.Mode, Interfaces: c.Interfaces, Bootstrap: c.Bootstrap, Standby: c.Standby}
	vip, err := netip.ParseAddr(c.VIP)
	switch {
	case err != nil || vip.Zone() != "" || vip.Is4In6():
		bad("vip", "%q is not an IP address; give the control-plane endpoint's IPv4 or IPv6 address", c.VIP)
	case vip.IsUnspecified() || vip.IsMulticast() || vip.IsLoopback() || vip.IsLinkLocalUnicast():
		bad("vip", "%s is not a unicast address a node can announce", vip)
	default:
		s.VIP = vip
	}
	switch c.Mode {
	case ModeL2, ModeBGP:
	default:
		bad("mode", "%q; give L2 (ARP/NDP, one node at a time) or BGP (every ready node, anycast)", c.Mode)
	}
	for i, ifi := range c.Interfaces {
		if ifi == "" || len(ifi) > 15 || strings.ContainsAny(ifi, "/ \t\n") {
			bad(fmt.Sprintf("interfaces[%d]", i), "%q is not an interface name; give a name such as eth0", ifi)
		}
	}

	names, addrs := map[string]int{}, map[netip.Addr]int{}
	for i, n := range c.Nodes {
		at := fmt.Sprintf("nodes[%d]", i)
		m := Member{Name: n.Name, Priority: n.Priority}
		if n.Name == "" {
			bad(at+".name", "empty; give the node's name")
		} else if j, dup := names[n.Name]; dup {
			bad(at+".name", "%q is also nodes[%d]; give each node once", n.Name, j)
		}
		names[n.Name] = i
		a, err := netip.ParseAddr(n.Address)
		switch {
		case err != nil || a.Zone() != "":
			bad(at+".address", "%q is not an IP address; give the node's data-plane address", n.Address)
		case a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() || a.Is4In6():
			bad(at+".address", "%s is not a unicast address heartbeats can come from", a)
		case a == vip:
			bad(at+".address", "%s is the VIP; give the node's own address", a)
		case s.VIP.IsValid() && a.Is4() != s.VIP.Is4():
			bad(at+".address", "%s is not of the VIP's family; give the node's IPv%d address", a, map[bool]int{true: 4, false: 6}[s.VIP.Is4()])
		default:
			if j, dup := addrs[a]; dup {
				bad(at+".address", "%s is also nodes[%d]'s address", a, j)
			}
			addrs[a] = i
			m.Addr = a
		}
		if n.HeartbeatKey != "" {
			key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(n.HeartbeatKey))
			if err == nil {
				err = failover.ValidPublicKey(key)
			}
			if err != nil {
				bad(at+".heartbeatKey", "%v; give the key `metalvip-agent --print-heartbeat-key` printed on %s", err, n.Name)
			} else {
				m.Key = key
			}
		}
		s.Members = append(s.Members, m)
	}
	if len(c.Nodes) == 0 {
		bad("nodes", "empty; list every control-plane node, this one among them")
	}
	if i, ok := names[c.Node]; ok && c.Node != "" {
		s.Self = s.Members[i]
	} else {
		bad("node", "%q is not one of nodes; give this node's name as nodes lists it", c.Node)
	}
	if c.Mode == ModeL2 && len(c.Nodes) > 1 {
		for i, n := range c.Nodes {
			if n.HeartbeatKey == "" {
				bad(fmt.Sprintf("nodes[%d].heartbeatKey", i), "missing; in L2 mode every node needs its key (run `metalvip-agent --print-heartbeat-key` on %s)", n.Name)
			}
		}
	}
	slices.SortStableFunc(s.Members, func(a, b Member) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), strings.Compare(a.Name, b.Name))
	})

	hb := c.Heartbeat
	s.QuorumPort, s.CandidatePort = port(hb.QuorumPort, DefaultQuorumPort, "heartbeat.quorumPort", bad), port(hb.CandidatePort, DefaultCandidatePort, "heartbeat.candidatePort", bad)
	if s.QuorumPort != 0 && s.QuorumPort == s.CandidatePort {
		bad("heartbeat.candidatePort", "%d is also the quorum port; give two ports", s.CandidatePort)
	}
	s.Interval = orDuration(hb.Interval.Duration, defaultHeartbeatInterval)
	if s.Interval < 10*time.Millisecond || s.Interval > 10*time.Second {
		bad("heartbeat.interval", "%s is out of range; give 10ms to 10s", s.Interval)
	}
	s.Misses = cmp.Or(hb.Misses, defaultHeartbeatMisses)
	if s.Misses < 2 || s.Misses > 100 {
		bad("heartbeat.misses", "%d is out of range; give 2 to 100", s.Misses)
	}

	as := c.APIServer
	s.Health = Health{
		URL: as.URL, CAFile: cmp.Or(as.CAFile, DefaultCAFile),
		Interval: orDuration(as.Interval.Duration, defaultProbeInterval), Timeout: orDuration(as.Timeout.Duration, defaultProbeTimeout),
		Rise: cmp.Or(as.Rise, defaultRise), Fall: cmp.Or(as.Fall, defaultFall),
	}
	if s.Health.URL == "" && s.Self.Addr.IsValid() {
		s.Health.URL = "https://" + netip.AddrPortFrom(s.Self.Addr, DefaultAPIServerPort).String() + "/readyz"
	}
	if u, err := url.Parse(s.Health.URL); as.URL != "" && (err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "") {
		bad("apiServer.url", "%q is not an http(s) URL; give the local kube-apiserver's /readyz, e.g. https://127.0.0.1:6443/readyz", as.URL)
	} else if as.URL != "" {
		host, _ := netip.ParseAddr(strings.Trim(u.Hostname(), "[]"))
		loopback := host.IsLoopback() || u.Hostname() == "localhost"
		switch {
		case host.IsValid() && s.VIP.IsValid() && host.Unmap() == s.VIP.Unmap():
			bad("apiServer.url", "%q checks the kube-apiserver through the VIP itself: the check passes only while some node holds the VIP, so once it drops no node is ready to take it back; give this node's own kube-apiserver, e.g. https://127.0.0.1:6443/readyz", as.URL)
		case u.Scheme == "http" && !loopback:
			bad("apiServer.url", "%q is plain http to another host: anyone on the path could answer the check and keep this node holding the VIP; give https (the kube-apiserver serves /readyz only over https), or a loopback address", as.URL)
		}
	}
	if d := s.Health.Interval; d < 10*time.Millisecond || d > time.Minute {
		bad("apiServer.interval", "%s is out of range; give 10ms to 1m", d)
	}
	if d := s.Health.Timeout; d < 10*time.Millisecond || d > time.Minute {
		bad("apiServer.timeout", "%s is out of range; give 10ms to 1m", d)
	}
	if s.Health.Rise < 1 || s.Health.Rise > 100 {
		bad("apiServer.rise", "%d is out of range; give 1 to 100", s.Health.Rise)
	}
	if s.Health.Fall < 1 || s.Health.Fall > 100 {
		bad("apiServer.fall", "%d is out of range; give 1 to 100", s.Health.Fall)
	}

	switch {
	case c.Mode == ModeBGP && (c.BGP == nil || len(c.BGP.Peers) == 0):
		bad("bgp.peers", "empty; BGP mode needs at least one router")
	case c.Mode != ModeBGP && c.BGP != nil:
		bad("bgp", "given in %s mode; remove it, or set mode: BGP", c.Mode)
	case c.BGP != nil:
		checkBGP(c.BGP, s, bad)
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return s, nil
}

func checkBGP(b *BGP, s *Spec, bad func(field, format string, args ...any)) {
	s.ASN = b.ASN
	if b.RouterID != "" {
		if a, err := netip.ParseAddr(b.RouterID); err != nil || !a.Is4() {
			bad("bgp.routerID", "%q is not an IPv4 address; give the node's IPv4 address, or none for the agent's", b.RouterID)
		} else {
			s.RouterID = a
		}
	}
	seen := map[netip.Addr]int{}
	for i, p := range b.Peers {
		at := fmt.Sprintf("bgp.peers[%d]", i)
		addr, err := netip.ParseAddr(p.Address)
		if err != nil {
			bad(at+".address", "%q is not an IP address; give the router's address", p.Address)
			continue
		}
		if j, dup := seen[addr.Unmap()]; dup {
			bad(at+".address", "%s is also bgp.peers[%d]; give each router once", addr, j)
			continue
		}
		seen[addr.Unmap()] = i
		peer := bgp.Peer{
			Address: addr, Port: p.Port, PeerASN: p.PeerASN, LocalASN: p.LocalASN,
			HoldTime: time.Duration(p.HoldTimeSeconds) * time.Second, Keepalive: time.Duration(p.KeepaliveSeconds) * time.Second,
			MultihopTTL: p.EBGPMultihop, TTLSecurity: p.TTLSecurity,
		}
		if p.BFD != nil {
			peer.BFD = bgp.BFD{Enabled: true, MinRx: time.Duration(p.BFD.MinRxMs) * time.Millisecond,
				MinTx: time.Duration(p.BFD.MinTxMs) * time.Millisecond, Multiplier: p.BFD.Multiplier}
		}
		if p.PasswordFile != "" {
			pw, err := os.ReadFile(p.PasswordFile)
			if err != nil {
				// Fail closed: no session rather than one without its password.
				bad(at+".passwordFile", "%v", err)
				continue
			}
			peer.Password = strings.TrimRight(string(pw), "\r\n")
		}
		if err := bgp.CheckPeer(s.ASN, peer); err != nil {
			var fe *bgp.FieldError
			if errors.As(err, &fe) {
				bad(at+"."+peerField(fe.Field), "%s", fe.Reason)
			} else {
				bad(at, "%v", err)
			}
			continue
		}
		if peer.LocalASN == 0 {
			peer.LocalASN = s.ASN
		}
		s.Peers = append(s.Peers, peer)
	}
}

// peerField names a bgp.Peer field as the file spells it.
func peerField(goName string) string {
	switch goName {
	case "Address":
		return "address"
	case "PeerASN":
		return "peerASN"
	case "LocalASN":
		return "localASN"
	case "HoldTime":
		return "holdTimeSeconds"
	case "Keepalive":
		return "keepaliveSeconds"
	case "MultihopTTL":
		return "ebgpMultihop"
	case "BFD.MinRx":
		return "bfd.minRxMs"
	case "BFD.MinTx":
		return "bfd.minTxMs"
	case "BFD.Multiplier":
		return "bfd.multiplier"
	case "BFD.Enabled":
		return "bfd"
	}
	return goName
}

func port(v, def int, field string, bad func(field, format string, args ...any)) uint16 {
	if v == 0 {
		return uint16(def)
	}
	if v < 1 || v > 65535 {
		bad(field, "%d is not a UDP port; give 1 to 65535", v)
		return 0
	}
	return uint16(v)
}

func orDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
