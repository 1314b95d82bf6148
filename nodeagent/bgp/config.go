package bgp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/metalvip/metalvip/internal/agentapi"
)

// Config describes the local side of every session of a Speaker.
type Config struct {
	// RouterID is the BGP identifier: the node's IPv4 address.
	RouterID netip.Addr
	// ASN is the local AS number for peers that do not set Peer.LocalASN.
	ASN uint32
	// ListenPort is the TCP port the speaker accepts sessions on. -1 (and 0, the zero value)
	// means it does not listen and only dials its peers.
	ListenPort int32
	// ListenAddresses limits listening to these addresses; empty means every address. Only
	// used when ListenPort > 0.
	ListenAddresses []netip.Addr
	// Logger receives gobgp's log; nil sends it to klog.
	Logger *slog.Logger
	// Restarting: the agent resumed the routes it advertised before (a restart). The first
	// session to each peer with graceful restart says so (RFC 4724: the restart state and
	// forwarding state bits), so the peer keeps this node's routes until they are sent again;
	// without the forwarding state bit a peer drops them when the new session comes up, and
	// its ECMP set loses the node until the UPDATE follows (connections through it reset).
	Restarting bool
}

// BFD configures Bidirectional Forwarding Detection (RFC 5880, single hop, RFC 5881) for a
// peer, with gobgp's own BFD. When BFD fails, gobgp resets the BGP session at once, and the
// peer, running BFD too, drops it on its side after its detection time (its multiplier
// times the negotiated interval), without waiting for the hold timer. BFD starts shortly
// after each BGP session is established and stops when it drops (see bfdSettle); while
// any peer runs it, gobgp listens on UDP port 3784 on every address.
type BFD struct {
	Enabled bool
	// MinRx is the shortest interval between BFD packets this side accepts to receive,
	// MinTx the interval at which it would like to send them; 0 = 300 ms. Whole
	// microseconds. Each side sends at the slower of its MinTx and the other's MinRx.
	MinRx, MinTx time.Duration
	// Multiplier is how many missed packets declare the session down; 0 = 3.
	Multiplier uint32
}

// Peer is one BGP neighbor: at Address, or, unnumbered, at the link-local address of the
// one neighbour on Interface.
type Peer struct {
	Address netip.Addr
	// Interface makes the session unnumbered (RFC 5549/8950, "BGP unnumbered"): the peer is
	// the one IPv6 link-local neighbour of this point-to-point link, found in the kernel's
	// neighbour table (the speaker solicits it), and the session carries IPv4 and IPv6
	// routes, IPv4 with an IPv6 next hop (the extended next hop capability). Exclusive with
	// Address, SourceAddress, MultihopTTL and Passive.
	Interface string
	// Port is the peer's TCP port; 0 = 179.
	Port uint16
	// PeerASN is the peer's AS number; LocalASN overrides Config.ASN for this session (0 =
	// Config.ASN). Equal numbers make an iBGP session.
	PeerASN, LocalASN uint32
	// HoldTime and Keepalive are proposed in OPEN; 0 = defaults (90 s and a third of the hold
	// time). Whole seconds; the hold time is 0 or at least 3 s.
	HoldTime, Keepalive time.Duration
	// Password turns on TCP MD5 signatures (RFC 2385).
	Password string
	// MultihopTTL allows an eBGP peer that many hops away; 0 = directly connected (TTL 1).
	MultihopTTL uint8
	// TTLSecurity (GTSM, RFC 5082): the session's packets are sent with TTL 255 and only
	// those that arrive with at least 256 minus the hops (MultihopTTL, 1 when 0) are taken, so
	// that nothing farther away can reach the session, not even to reset it.
	TTLSecurity bool
	// BFD turns on fast failure detection. Single hop only: not with MultihopTTL.
	BFD BFD
	// GracefulRestart advertises the graceful restart capability (RFC 4724), so that the peer
	// keeps this speaker's routes for a while when the agent dies without a goodbye. Shutdown
	// still withdraws everything first.
	GracefulRestart bool
	// Passive waits for the peer to connect instead of dialing it (needs Config.ListenPort).
	Passive bool
	// SourceAddress is the local address the session is opened from (one of the node's, of
	// Address's family); invalid: the kernel's choice.
	SourceAddress netip.Addr
	// ConnectRetry is the wait between dial attempts; 0 = 5 s. Whole seconds, at most 65535.
	ConnectRetry time.Duration
}

// Route is one VIP to announce, with this speaker as the next hop.
type Route struct {
	// Prefix is a /32 or a /128 for a VIP, or an aggregate such as the ClusterIP range
	// (no bits set after its length).
	Prefix netip.Prefix
	// Communities are standard communities, "ASN:value" with both halves at most 65535.
	Communities []string
	// LargeCommunities are RFC 8092's, "ASN:value1:value2", each part at most 4294967295.
	LargeCommunities []string
	// LocalPref is sent to iBGP peers only (RFC 4271 keeps it inside an AS); 0 = unset.
	LocalPref uint32
	// Weight, when not 0, adds the link-bandwidth extended community (non-transitive, type
	// 0x40 0x04, draft-ietf-idr-link-bandwidth) with Weight times BandwidthUnit, so that a
	// router doing weighted ECMP sends this node its share. At most MaxWeight.
	Weight uint32
	// GracefulShutdown adds the GRACEFUL_SHUTDOWN community (65535:0, RFC 8326) and, to
	// iBGP peers, LOCAL_PREF 0: routers that honour it stop choosing this path while they
	// have another, before it is withdrawn.
	GracefulShutdown bool
}

// BandwidthUnit is the link bandwidth one unit of Route.Weight stands for: 1 Mbit/s, in
// bytes per second as the community carries it. Routers compare the values of a prefix's
// paths, so the unit only sets the range: MaxWeight units stay within a float32's exact
// integers and far below any router's ceiling.
const BandwidthUnit = 125000

// MaxWeight is the largest Route.Weight.
const MaxWeight = 100000

// communityGracefulShutdown is GRACEFUL_SHUTDOWN (RFC 8326), 65535:0.
const communityGracefulShutdown = 0xFFFF0000

// Defaults that apply when a field is left zero.
const (
	defaultHoldTime      = 90 * time.Second // gobgp's and RFC 4271's suggestion
	defaultBFDInterval   = 300 * time.Millisecond
	defaultBFDMultiplier = 3
	// connectRetry is how often a speaker redials a peer it cannot reach. gobgp's default
	// (120 s) would keep a VIP unannounced for minutes after a router restarts.
	connectRetry = 5 * time.Second
	// idleHoldAfterReset is how long a speaker waits before redialing a peer whose session it
	// reset (BFD down, for one): some damping for a flapping link, but not gobgp's 30 s.
	idleHoldAfterReset = 5 * time.Second
	// gracefulRestartTime is how long a peer keeps our routes after we vanish (GR only).
	gracefulRestartTime = 120 * time.Second
	// restartDeferral bounds how long a restarting speaker waits for a peer's End-of-RIB
	// before it sends its routes (gobgp's deferral time; its default is 360 s). Part of the
	// peer's configuration from the start: a change of it resets the session.
	restartDeferral = 10 * time.Second
)

// ErrShutdown is returned by every method called after Shutdown.
var ErrShutdown = errors.New("bgp speaker is shut down")

func (c Config) validate() error {
	if !c.RouterID.Is4() {
		return fmt.Errorf("router ID %q: want an IPv4 address", c.RouterID)
	}
	if c.ASN == 0 {
		return errors.New("local ASN is 0")
	}
	if c.ListenPort < -1 || c.ListenPort > 65535 {
		return fmt.Errorf("listen port %d: want -1 (no listening) or 1 to 65535", c.ListenPort)
	}
	for _, a := range c.ListenAddresses {
		if !a.IsValid() {
			return errors.New("invalid listen address")
		}
	}
	return nil
}

// peerKey is a peer's identity: one session per address, and per interface for unnumbered
// peers, whose key is fe80:: zoned with the interface (keyOf). gobgp names an unnumbered
// session by the neighbour's zoned link-local address; keyOfNeighbor maps it back. Numbered
// link-local peers are refused, so a zoned link-local key is always an unnumbered peer's.
type peerKey = netip.Addr

// unnumberedBase is the address of every unnumbered peer's key, zoned with its interface.
var unnumberedBase = netip.MustParseAddr("fe80::")

// keyOf is p's identity.
func keyOf(p Peer) peerKey {
	if p.Interface != "" {
		return unnumberedBase.WithZone(p.Interface)
	}
	return p.Address
}

// keyOfNeighbor maps the neighbour address gobgp reports to the peer's key.
func keyOfNeighbor(a netip.Addr) peerKey {
	if a.Zone() != "" && a.IsLinkLocalUnicast() {
		return unnumberedBase.WithZone(a.Zone())
	}
	return a
}

// interfaceOf is the interface of an unnumbered peer's key, "" for a numbered one.
func interfaceOf(k peerKey) string {
	if k.Zone() != "" && k.IsLinkLocalUnicast() {
		return k.Zone()
	}
	return ""
}

// Name is how logs and errors name the peer: its address, or "interface <name>".
func (p Peer) Name() string {
	if p.Interface != "" {
		return "interface " + p.Interface
	}
	return p.Address.String()
}

// FieldError says which field of a Peer is wrong, and what to write instead.
type FieldError struct {
	// Field is the Peer field at fault, as Go names it: "Address", "Keepalive", "BFD.MinRx".
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// CheckPeer reports whether SetPeers would take p on a speaker whose Config.ASN is asn: nil,
// or a *FieldError naming the field. It is the one place these rules live, so that a caller
// can refuse a peer alone, with the reason, before it reaches the speaker.
func CheckPeer(asn uint32, p Peer) error {
	_, err := normalizePeer(Config{ASN: asn, ListenPort: -1}, p)
	return err
}

// normalizePeers validates peers and returns them keyed by address, with defaults filled in
// so that comparing two values tells whether the session's configuration changed.
func normalizePeers(cfg Config, peers []Peer) (map[peerKey]Peer, error) {
	out := make(map[peerKey]Peer, len(peers))
	var errs []error
	for _, p := range peers {
		n, err := normalizePeer(cfg, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", p.Name(), err))
			continue
		}
		if _, dup := out[keyOf(n)]; dup {
			errs = append(errs, fmt.Errorf("peer %s: listed twice", n.Name()))
			continue
		}
		out[keyOf(n)] = n
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func normalizePeer(cfg Config, p Peer) (Peer, error) {
	if p.Interface != "" {
		if err := checkUnnumbered(p); err != nil {
			return p, err
		}
	} else if !p.Address.IsValid() {
		return p, fieldErr("Address", "missing; give the peer's IP address")
	}
	if p.Interface != "" {
		// Checked above.
	} else if p.Address.Zone() != "" || p.Address.Unmap().IsLinkLocalUnicast() {
		return p, fieldErr("Address", "%s is link-local; give the peer's global or unique local address, or the interface for BGP unnumbered", p.Address)
	}
	p.Address = p.Address.Unmap()
	if p.Interface == "" && (p.Address.IsUnspecified() || p.Address.IsMulticast()) {
		return p, fieldErr("Address", "%s is not a unicast address; give the peer's own address", p.Address)
	}
	if p.PeerASN == 0 {
		return p, fieldErr("PeerASN", "missing; give the peer's AS number, 1 to 4294967295")
	}
	if p.LocalASN == 0 {
		p.LocalASN = cfg.ASN
	}
	if p.LocalASN == 0 {
		return p, fieldErr("LocalASN", "missing, and the speaker has no default; give this side's AS number, 1 to 4294967295")
	}
	if p.HoldTime < 0 || p.HoldTime%time.Second != 0 || p.HoldTime > 65535*time.Second || (p.HoldTime != 0 && p.HoldTime < 3*time.Second) {
		return p, fieldErr("HoldTime", "%s: give 0 (the default, %s) or whole seconds from 3s to 65535s (RFC 4271)", p.HoldTime, defaultHoldTime)
	}
	if p.Keepalive < 0 || p.Keepalive%time.Second != 0 {
		return p, fieldErr("Keepalive", "%s: give whole seconds", p.Keepalive)
	}
	hold := p.HoldTime
	if hold == 0 {
		hold = defaultHoldTime
	}
	if p.Keepalive >= hold {
		return p, fieldErr("Keepalive", "%s is not shorter than the hold time %s; give a keepalive under the hold time, usually a third of it", p.Keepalive, hold)
	}
	if p.SourceAddress.IsValid() {
		p.SourceAddress = p.SourceAddress.Unmap()
		if p.SourceAddress.Is4() != p.Address.Is4() {
			return p, fieldErr("SourceAddress", "%s is not of the address family of %s", p.SourceAddress, p.Address)
		}
	}
	if p.ConnectRetry == 0 {
		p.ConnectRetry = connectRetry
	}
	if p.ConnectRetry < time.Second || p.ConnectRetry > 65535*time.Second || p.ConnectRetry%time.Second != 0 {
		return p, fieldErr("ConnectRetry", "%s: give 0 (the default, %s) or whole seconds from 1 to 65535", p.ConnectRetry, connectRetry)
	}
	if p.Passive && cfg.ListenPort <= 0 {
		return p, fieldErr("Passive", "the speaker does not listen (Config.ListenPort); turn Passive off")
	}
	if !p.BFD.Enabled {
		p.BFD = BFD{}
		return p, nil
	}
	if p.MultihopTTL > 0 {
		return p, fieldErr("BFD.Enabled", "BFD is single hop only (RFC 5881); turn BFD off or remove the multihop TTL")
	}
	if p.BFD.MinRx == 0 {
		p.BFD.MinRx = defaultBFDInterval
	}
	if p.BFD.MinTx == 0 {
		p.BFD.MinTx = defaultBFDInterval
	}
	for _, iv := range []struct {
		field string
		d     time.Duration
	}{{"BFD.MinRx", p.BFD.MinRx}, {"BFD.MinTx", p.BFD.MinTx}} {
		if iv.d < time.Millisecond || iv.d > time.Minute || iv.d%time.Microsecond != 0 {
			return p, fieldErr(iv.field, "%s: give 0 (the default, %s) or whole microseconds from 1ms to 1m", iv.d, defaultBFDInterval)
		}
	}
	if p.BFD.Multiplier == 0 {
		p.BFD.Multiplier = defaultBFDMultiplier
	}
	if p.BFD.Multiplier > 255 {
		return p, fieldErr("BFD.Multiplier", "%d: give 0 (the default, %d) or 1 to 255", p.BFD.Multiplier, defaultBFDMultiplier)
	}
	return p, nil
}

// checkUnnumbered checks the fields an unnumbered peer (Interface) must and must not have.
func checkUnnumbered(p Peer) error {
	if err := agentapi.CheckInterfaceName(p.Interface); err != nil {
		return fieldErr("Interface", "%v", err)
	}
	switch {
	case p.Address.IsValid():
		return fieldErr("Address", "an unnumbered peer (Interface %s) has no address: the router is the link's link-local neighbour; give one of the two", p.Interface)
	case p.SourceAddress.IsValid():
		return fieldErr("SourceAddress", "an unnumbered session runs from the node's link-local address on %s; remove the source address", p.Interface)
	case p.MultihopTTL > 0:
		return fieldErr("MultihopTTL", "an unnumbered peer is on the link %s, one hop away; remove the multihop TTL", p.Interface)
	case p.Passive:
		return fieldErr("Passive", "an unnumbered session is dialed to the link's neighbour; turn Passive off")
	}
	return nil
}

// route is a validated Route: communities parsed, sorted and without duplicates, so that
// two routes compare equal when they announce the same thing.
type route struct {
	prefix      netip.Prefix
	communities string // the sorted values joined, comparable
	values      []uint32
	large       string // the sorted large communities joined, comparable
	largeValues []bgp.LargeCommunity
	localPref   uint32
	weight      uint32
	gshut       bool
}

func (r route) equal(o route) bool {
	return r.prefix == o.prefix && r.communities == o.communities && r.large == o.large && r.localPref == o.localPref &&
		r.weight == o.weight && r.gshut == o.gshut
}

func normalizeRoutes(routes []Route) (map[netip.Prefix]route, error) {
	out := make(map[netip.Prefix]route, len(routes))
	var errs []error
	for _, r := range routes {
		n, err := normalizeRoute(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s: %w", r.Prefix, err))
			continue
		}
		if _, dup := out[n.prefix]; dup {
			errs = append(errs, fmt.Errorf("route %s: listed twice", n.prefix))
			continue
		}
		out[n.prefix] = n
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func normalizeRoute(r Route) (route, error) {
	p := r.Prefix
	if !p.IsValid() {
		return route{}, errors.New("invalid prefix")
	}
	if p.Addr().Is4In6() {
		return route{}, errors.New("IPv4-mapped IPv6 prefix: give the IPv4 form")
	}
	if p.Addr().Zone() != "" {
		return route{}, errors.New("zoned prefix")
	}
	if p.Masked() != p {
		return route{}, fmt.Errorf("bits set after the prefix length: want %s", p.Masked())
	}
	if p.Addr().IsUnspecified() || p.Addr().IsMulticast() || p.Addr().IsLoopback() || p.Addr().IsLinkLocalUnicast() {
		return route{}, errors.New("not a usable unicast address")
	}
	if r.Weight > MaxWeight {
		return route{}, fmt.Errorf("weight %d is above %d", r.Weight, MaxWeight)
	}
	values := make([]uint32, 0, len(r.Communities)+1)
	for _, c := range r.Communities {
		v, err := ParseCommunity(c)
		if err != nil {
			return route{}, err
		}
		values = append(values, v)
	}
	if r.GracefulShutdown {
		values = append(values, communityGracefulShutdown)
	}
	slices.Sort(values)
	values = slices.Compact(values)
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = strconv.FormatUint(uint64(v), 10)
	}
	large := make([]bgp.LargeCommunity, 0, len(r.LargeCommunities))
	for _, c := range r.LargeCommunities {
		v, err := ParseLargeCommunity(c)
		if err != nil {
			return route{}, err
		}
		large = append(large, v)
	}
	slices.SortFunc(large, func(a, b bgp.LargeCommunity) int {
		return cmp.Or(cmp.Compare(a.ASN, b.ASN), cmp.Compare(a.LocalData1, b.LocalData1), cmp.Compare(a.LocalData2, b.LocalData2))
	})
	large = slices.Compact(large)
	largeParts := make([]string, len(large))
	for i, v := range large {
		largeParts[i] = fmt.Sprintf("%d:%d:%d", v.ASN, v.LocalData1, v.LocalData2)
	}
	return route{prefix: p, values: values, communities: strings.Join(parts, ","), large: strings.Join(largeParts, ","), largeValues: large,
		localPref: r.LocalPref, weight: r.Weight, gshut: r.GracefulShutdown}, nil
}

// ParseLargeCommunity parses a large community written "ASN:value1:value2" (RFC 8092), each
// part decimal and at most 4294967295.
func ParseLargeCommunity(s string) (bgp.LargeCommunity, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return bgp.LargeCommunity{}, fmt.Errorf("large community %q: want ASN:value1:value2", s)
	}
	var v [3]uint32
	for i, part := range parts {
		n, err := strconv.ParseUint(part, 10, 32)
		if err != nil {
			return bgp.LargeCommunity{}, fmt.Errorf("large community %q: each part must be 0 to 4294967295", s)
		}
		v[i] = uint32(n)
	}
	return bgp.LargeCommunity{ASN: v[0], LocalData1: v[1], LocalData2: v[2]}, nil
}

// ParseCommunity parses a standard BGP community written "ASN:value" (RFC 1997), both
// halves decimal and at most 65535, into its 32-bit value.
func ParseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("community %q: want ASN:value", s)
	}
	a, err := strconv.ParseUint(hi, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("community %q: ASN part must be 0 to 65535", s)
	}
	v, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("community %q: value part must be 0 to 65535", s)
	}
	return uint32(a)<<16 | uint32(v), nil
}

// FormatCommunity is the inverse of ParseCommunity.
func FormatCommunity(v uint32) string {
	return strconv.FormatUint(uint64(v>>16), 10) + ":" + strconv.FormatUint(uint64(v&0xffff), 10)
}
