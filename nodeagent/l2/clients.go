package l2

import (
	"cmp"
	"hash/maphash"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// The client table remembers, for each per-client VIP, the hosts seen asking for it (address,
// MAC, interface), so that a node taking clients over can tell each one at once with a
// unicast reply. Anyone on the segment can send ARP and NDP with any source, so the table
// must not let a flood of forged senders push real clients out, nor let a forger redirect a
// real client's takeover reply to itself. Its defences, cheapest first:
//
//   - only requests for the per-client VIPs this node is a candidate of are learnt, and only
//     from a sane sender (a unicast MAC that is also the frame's source, a unicast address
//     of the VIP's family that is not the VIP);
//   - per-source rate limits: a sender MAC, or a sender address, that sends too much in a
//     second is not heard beyond its limit (it is still answered);
//   - a global admission budget for clients never seen before, so that a burst of new
//     senders fills the table slowly, whatever their number;
//   - a segmented LRU (SLRU): a new client enters a probation segment and is promoted to a
//     protected one when it asks again. Probation is evicted first (its least recently seen
//     client); the protected segment loses its least recently seen client only to another
//     client that asked at least twice, and then to probation, not out. A flood of one-shot
//     senders therefore churns probation only: clients that keep asking stay.
//     SLRU rather than 2Q: both give the flood-proof property, and SLRU needs no ghost
//     queue of forgotten keys (memory a flood could also grow); rather than plain LRU, which
//     any flood of new senders empties;
//   - a known client's MAC or interface changes only when the new one is seen several times
//     over a while and the old one not once in between: a client that keeps asking keeps
//     its MAC, whatever a forger sends in its name.
//
// Memory is bounded by the two segments' sizes (about 200 bytes a client) plus fixed rate
// tables. Only the protected clients are worth keeping across a restart (KnownClients).
//
// The limit: a node hears a client's broadcast requests only. A client that keeps its cache
// entry fresh by unicast to its owner is heard once by the other nodes and stays in their
// probation, where a long flood can push it out; it then moves by itself when its entry for
// a dead owner fails.

// ClientLimits bound the client table; a zero field takes its default.
type ClientLimits struct {
	// Protected is how many clients that asked at least twice are kept (default 16384);
	// Probation how many that asked once (default 4096). Both count every per-client VIP.
	Protected, Probation int
	// NewPerSecond is how many clients never seen before are admitted a second, with bursts
	// of NewBurst (defaults 256 and 1024); beyond that new senders are answered, not learnt.
	NewPerSecond, NewBurst int
	// PerMACPerSecond and PerIPPerSecond are how many sightings in a second one sender MAC,
	// or one sender address, may make count (defaults 100 each).
	PerMACPerSecond, PerIPPerSecond int
	// MoveSightings and MoveAfter: a known client's MAC or interface changes only once the
	// new one has been seen MoveSightings times over at least MoveAfter, with the old one
	// silent meanwhile (defaults 3 and 5 minutes).
	MoveSightings int
	MoveAfter     time.Duration
}

func (l ClientLimits) withDefaults() ClientLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.Protected, 16384)
	def(&l.Probation, 4096)
	def(&l.NewPerSecond, 256)
	def(&l.NewBurst, 1024)
	def(&l.PerMACPerSecond, 100)
	def(&l.PerIPPerSecond, 100)
	def(&l.MoveSightings, 3)
	if l.MoveAfter <= 0 {
		l.MoveAfter = 5 * time.Minute
	}
	return l
}

// Client is a host seen asking for a per-client VIP.
type Client struct {
	VIP, IP   netip.Addr
	MAC       net.HardwareAddr
	Interface string
}

// sighting is what the table hears: a sender asking for a per-client VIP.
type sighting struct {
	vip, ip netip.Addr
	at      station
}

// station is where a client is: its MAC on an interface of this node.
type station struct {
	mac   [6]byte
	iface string
}

type segment uint8

const (
	probation segment = iota
	protected
)

type clientEntry struct {
	vip, ip    netip.Addr
	at         station
	seg        segment
	seen       uint64       // the table's sighting count when last seen: orders clientsOf
	prev, next *clientEntry // in its segment's list, most recently seen first
	move       *move        // another station claiming this client, not yet believed
}

type move struct {
	to     station
	first  time.Time
	counts int
}

// verdict is what became of a sighting; tests and counters read it.
type verdict uint8

const (
	learnt      verdict = iota // a new client, in probation
	refreshed                  // a known client, same station (promoted if it was in probation)
	moveHeld                   // a known client claimed from another station: not believed yet
	moved                      // a known client's new station believed
	throttled                  // its source is over its rate
	notAdmitted                // a new client over the admission budget
)

// clientTable is the table; its methods are safe for concurrent use.
type clientTable struct {
	lim ClientLimits
	now func() time.Time

	mu        sync.Mutex
	byVIP     map[netip.Addr]map[netip.Addr]*clientEntry
	segs      [2]clientList
	perMAC    *sourceLimit
	perIP     *sourceLimit
	admission *rate.Limiter
	version   uint64 // grows whenever the protected clients change
	sightings uint64
	stats     ClientStats
}

// ClientStats count what the client table did with what it heard.
type ClientStats struct {
	Learnt, Promoted, Moved, MovesHeld uint64
	Throttled, NotAdmitted, Evicted    uint64
}

func newClientTable(lim ClientLimits, now func() time.Time) *clientTable {
	lim = lim.withDefaults()
	return &clientTable{
		lim:       lim,
		now:       now,
		byVIP:     map[netip.Addr]map[netip.Addr]*clientEntry{},
		perMAC:    newSourceLimit(lim.PerMACPerSecond),
		perIP:     newSourceLimit(lim.PerIPPerSecond),
		admission: rate.NewLimiter(rate.Limit(lim.NewPerSecond), lim.NewBurst),
	}
}

// saneSender reports whether a sender may be learnt as a client of vip: a unicast address of
// vip's family that is not vip itself, and a unicast Ethernet MAC.
func saneSender(vip, ip netip.Addr, mac net.HardwareAddr) bool {
	if !ip.IsValid() || ip.Is4() != vip.Is4() || ip == vip || ip.IsUnspecified() || ip.IsMulticast() ||
		ip.IsLoopback() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	return len(mac) == 6 && mac[0]&1 == 0 && [6]byte(mac) != [6]byte{}
}

// see records a sighting. The caller has checked that vip is a per-client VIP of this node on
// the interface and that the sender is sane.
func (t *clientTable) see(s sighting) verdict {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.perMAC.allow(s.at.mac[:], now) {
		t.stats.Throttled++
		return throttled
	}
	t.sightings++
	e := t.byVIP[s.vip][s.ip]
	if e != nil && e.at == s.at {
		e.move = nil // the client itself still asks: whoever claims otherwise is not believed
		t.touch(e)
		return refreshed
	}
	ip16 := s.ip.As16()
	if !t.perIP.allow(ip16[:], now) {
		t.stats.Throttled++
		return throttled
	}
	if e != nil {
		return t.claim(e, s.at, now)
	}
	if !t.admission.AllowN(now, 1) {
		t.stats.NotAdmitted++
		return notAdmitted
	}
	e = &clientEntry{vip: s.vip, ip: s.ip, at: s.at, seg: probation, seen: t.sightings}
	m := t.byVIP[s.vip]
	if m == nil {
		m = map[netip.Addr]*clientEntry{}
		t.byVIP[s.vip] = m
	}
	m[s.ip] = e
	t.segs[probation].pushFront(e)
	t.stats.Learnt++
	t.trim()
	return learnt
}

// touch moves a client seen again to the front of its segment, promoting it out of probation;
// a full protected segment demotes its least recently seen client to probation.
func (t *clientTable) touch(e *clientEntry) {
	e.seen = t.sightings
	if e.seg == protected {
		t.segs[protected].moveToFront(e)
		return
	}
	t.segs[probation].remove(e)
	e.seg = protected
	t.segs[protected].pushFront(e)
	t.stats.Promoted++
	t.version++ // also for the client this may demote
	for t.segs[protected].n > t.lim.Protected {
		old := t.segs[protected].back()
		t.segs[protected].remove(old)
		old.seg = probation
		t.segs[probation].pushFront(old)
	}
	t.trim()
}

// claim handles a known client seen at another station.
func (t *clientTable) claim(e *clientEntry, at station, now time.Time) verdict {
	if e.move == nil || e.move.to != at {
		e.move = &move{to: at, first: now}
	}
	e.move.counts++
	if e.move.counts < t.lim.MoveSightings || now.Sub(e.move.first) < t.lim.MoveAfter {
		t.stats.MovesHeld++
		return moveHeld
	}
	e.at, e.move = at, nil
	if e.seg == protected {
		t.version++
	}
	t.touch(e)
	t.stats.Moved++
	return moved
}

// trim evicts the least recently seen clients of probation while it is over its size.
func (t *clientTable) trim() {
	for t.segs[probation].n > t.lim.Probation {
		t.drop(t.segs[probation].back())
		t.stats.Evicted++
	}
}

func (t *clientTable) drop(e *clientEntry) {
	t.segs[e.seg].remove(e)
	if e.seg == protected {
		t.version++
	}
	m := t.byVIP[e.vip]
	delete(m, e.ip)
	if len(m) == 0 {
		delete(t.byVIP, e.vip)
	}
}

// keepOnly forgets the clients of every VIP for which keep is false.
func (t *clientTable) keepOnly(keep func(netip.Addr) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for vip, m := range t.byVIP {
		if keep(vip) {
			continue
		}
		for _, e := range m {
			t.drop(e)
		}
	}
}

// clientsOf returns the clients of vip for which pick is true, protected ones first, each
// segment most recently seen first.
func (t *clientTable) clientsOf(vip netip.Addr, pick func(netip.Addr) bool) []Client {
	t.mu.Lock()
	var es []*clientEntry
	for ip, e := range t.byVIP[vip] {
		if pick(ip) {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *clientEntry) int {
		if a.seg != b.seg {
			return int(b.seg) - int(a.seg)
		}
		return cmp.Compare(b.seen, a.seen)
	})
	out := make([]Client, 0, len(es))
	for _, e := range es {
		out = append(out, e.client())
	}
	t.mu.Unlock()
	return out
}

// count returns how many clients of vip are known, and for how many answers is true.
func (t *clientTable) count(vip netip.Addr, answers func(netip.Addr) bool) (known, answered int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for ip := range t.byVIP[vip] {
		known++
		if answers(ip) {
			answered++
		}
	}
	return known, answered
}

// kept returns the protected clients, most recently seen first, and their version.
func (t *clientTable) kept() ([]Client, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Client, 0, t.segs[protected].n)
	for e := t.segs[protected].head; e != nil; e = e.next {
		out = append(out, e.client())
	}
	return out, t.version
}

// remember puts clients kept before a restart into the protected segment, in their order
// (most recently seen first), as far as it has room; malformed ones are skipped. It returns
// how many it took.
func (t *clientTable) remember(cs []Client) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	took := 0
	for _, c := range cs {
		if t.segs[protected].n >= t.lim.Protected {
			break
		}
		if c.Interface == "" || !c.VIP.IsValid() || !saneSender(c.VIP, c.IP, c.MAC) || t.byVIP[c.VIP][c.IP] != nil {
			continue
		}
		e := &clientEntry{vip: c.VIP, ip: c.IP, at: station{mac: [6]byte(c.MAC), iface: c.Interface}, seg: protected}
		m := t.byVIP[c.VIP]
		if m == nil {
			m = map[netip.Addr]*clientEntry{}
			t.byVIP[c.VIP] = m
		}
		m[c.IP] = e
		t.segs[protected].pushBack(e)
		took++
	}
	if took > 0 {
		t.version++
	}
	return took
}

func (t *clientTable) statsNow() ClientStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

func (e *clientEntry) client() Client {
	return Client{VIP: e.vip, IP: e.ip, MAC: slices.Clone(net.HardwareAddr(e.at.mac[:])), Interface: e.at.iface}
}

// clientList is a doubly linked list of clients, most recently seen first.
type clientList struct {
	head, tail *clientEntry
	n          int
}

func (l *clientList) pushFront(e *clientEntry) {
	e.prev, e.next = nil, l.head
	if l.head != nil {
		l.head.prev = e
	} else {
		l.tail = e
	}
	l.head = e
	l.n++
}

func (l *clientList) pushBack(e *clientEntry) {
	e.prev, e.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

func (l *clientList) remove(e *clientEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}

func (l *clientList) moveToFront(e *clientEntry) {
	if l.head != e {
		l.remove(e)
		l.pushFront(e)
	}
}

func (l *clientList) back() *clientEntry { return l.tail }

// sourceLimit counts sightings per source in one-second windows, in a fixed number of slots
// chosen by a keyed hash: its memory does not grow with the number of sources a flood forges,
// and a sender cannot pick the slot of another. Two sources sharing a slot share its limit.
type sourceLimit struct {
	seed  maphash.Seed
	limit uint32
	slots [4096]struct {
		sec int64
		n   uint32
	}
}

func newSourceLimit(perSecond int) *sourceLimit {
	return &sourceLimit{seed: maphash.MakeSeed(), limit: uint32(perSecond)}
}

func (l *sourceLimit) allow(key []byte, now time.Time) bool {
	s := &l.slots[maphash.Bytes(l.seed, key)%uint64(len(l.slots))]
	if sec := now.Unix(); s.sec != sec {
		s.sec, s.n = sec, 0
	}
	if s.n >= l.limit {
		return false
	}
	s.n++
	return true
}
