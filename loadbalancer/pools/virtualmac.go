package pools

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/loadbalancer/ipam"
)

// Virtual MACs (announce.l2.virtualMAC): an address's MAC is a prefix and the address's last
// bytes, so that it never changes while the address exists and needs no state. No two
// addresses of one segment may share a MAC; metalvip treats every pool as on one segment:
//
//	scheme  family  MAC                      block the addresses lie in   position in it
//	Local   IPv4    02:00 + the 4 bytes      the whole space              (never shared)
//	Local   IPv6    06    + the last 5 bytes one /88 per pool             last 40 bits
//	VRRP    IPv4    00:00:5e:00:01 + ID      one /24 per pool             last byte, 1 to 255
//	VRRP    IPv6    00:00:5e:00:02 + ID      one /120 per pool            last byte, 1 to 255
//
// Within a pool, addresses of one block have distinct positions, so distinct MACs (the CRD's
// CEL rules say the same). Two pools of one scheme and family whose blocks differ and whose
// positions overlap would give two addresses one MAC: the newer pool is not used.

// macScheme is the layout of one scheme and family.
type macScheme struct {
	prefix []byte // the MAC's first bytes
	block  int    // the prefix length of the block every address of a pool lies in
}

func schemeOf(s v1alpha1.VirtualMACScheme, f ipam.Family) macScheme {
	switch {
	case s == v1alpha1.VirtualMACVRRP && f == ipam.IPv4:
		return macScheme{prefix: []byte{0x00, 0x00, 0x5e, 0x00, 0x01}, block: 24}
	case s == v1alpha1.VirtualMACVRRP:
		return macScheme{prefix: []byte{0x00, 0x00, 0x5e, 0x00, 0x02}, block: 120}
	case f == ipam.IPv4:
		return macScheme{prefix: []byte{0x02, 0x00}, block: 0}
	default:
		return macScheme{prefix: []byte{0x06}, block: 88}
	}
}

// VirtualMAC is the MAC of addr under scheme s.
func VirtualMAC(s v1alpha1.VirtualMACScheme, addr netip.Addr) net.HardwareAddr {
	addr = addr.Unmap()
	sc := schemeOf(s, ipam.FamilyOf(addr))
	b := addr.AsSlice()
	return append(slices.Clone(sc.prefix), b[len(b)-(6-len(sc.prefix)):]...)
}

// VirtualMAC returns the MAC the pool's address addr is answered with, "" when the pool gives
// its addresses none (or is not used).
func (p *Pool) VirtualMAC(addr netip.Addr) string {
	if !p.Valid() || p.Announce.MACScheme == "" {
		return ""
	}
	return VirtualMAC(p.Announce.MACScheme, addr).String()
}

// macBlock is where a pool's addresses of one family lie, and their positions in it.
type macBlock struct {
	pool      *Pool
	family    ipam.Family
	block     netip.Prefix
	positions []ipam.Range // of the block's addresses, as addresses; compared by position
}

// position is addr's place in its block: the bits after the block's prefix.
func position(addr netip.Addr, block int) netip.Addr {
	b := addr.As16()
	skip := block + 128 - addr.BitLen()
	for i := range skip / 8 {
		b[i] = 0
	}
	if r := skip % 8; r != 0 {
		b[skip/8] &= 0xff >> r
	}
	return netip.AddrFrom16(b)
}

// checkVirtualMAC checks, for a pool with the given scheme, what the CEL rules check: each
// family's addresses lie in one block, and with VRRP none has position 0 (not a VRRP ID).
func checkVirtualMAC(s v1alpha1.VirtualMACScheme, addrs []v1alpha1.AddressRange, add func(string, string, ...any)) {
	first := map[ipam.Family]netip.Prefix{}
	for i, a := range addrs {
		r, err := ipam.ParseRange(string(a))
		if err != nil {
			continue // reported already
		}
		field := fmt.Sprintf("spec.addresses[%d]", i)
		f := r.Family()
		sc := schemeOf(s, f)
		blk := netip.PrefixFrom(r.First, sc.block).Masked()
		switch {
		case !blk.Contains(r.Last):
			add(field, "%s does not lie in one /%d: with virtualMAC scheme %s the MAC is made of the address's bits after the first %d, so two of its addresses would get one MAC", a, sc.block, s, sc.block)
			continue
		case first[f].IsValid() && first[f] != blk:
			add(field, "%s is not in the /%d of the pool's other %s addresses (%s): with virtualMAC scheme %s two addresses would get one MAC; give the pool addresses of one /%d", a, sc.block, f, first[f], s, sc.block)
			continue
		case s == v1alpha1.VirtualMACVRRP && position(r.First, sc.block).IsUnspecified():
			add(field, "%s holds %s, whose last byte 0 is no VRRP ID (1 to 255): start the range at the next address", a, r.First)
			continue
		}
		first[f] = blk
	}
}

// blocksOf returns a valid pool's virtual MAC blocks, one per family it has addresses of.
func blocksOf(p *Pool) []macBlock {
	var out []macBlock
	for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		b := macBlock{pool: p, family: f}
		sc := schemeOf(p.Announce.MACScheme, f)
		for _, r := range p.Allocation.Ranges {
			if r.Family() != f {
				continue
			}
			b.block = netip.PrefixFrom(r.First, sc.block).Masked()
			b.positions = append(b.positions, ipam.Range{First: position(r.First, sc.block), Last: position(r.Last, sc.block)})
		}
		if len(b.positions) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// macConflicts finds, among valid pools with virtual MACs, those that would give one of their
// addresses the MAC of an older pool's address, and says why, by pool name. Pools of one
// block share no MAC but for the same address (which only the older gives out).
func macConflicts(ps []*Pool) map[string][]Problem {
	var blocks []macBlock
	for _, p := range ps {
		if p.Valid() && p.Announce.MACScheme != "" {
			blocks = append(blocks, blocksOf(p)...)
		}
	}
	slices.SortFunc(blocks, func(a, b macBlock) int {
		return cmp.Or(a.pool.Created.Compare(b.pool.Created), cmp.Compare(a.pool.Name, b.pool.Name))
	})
	out := map[string][]Problem{}
	bad := map[string]bool{}
	for i, b := range blocks {
		if b.family == ipam.IPv4 && b.pool.Announce.MACScheme == v1alpha1.VirtualMACLocal {
			continue // the whole address: never shared
		}
	older:
		for _, o := range blocks[:i] {
			if bad[o.pool.Name] || o.family != b.family || o.pool.Announce.MACScheme != b.pool.Announce.MACScheme || o.block == b.block {
				continue
			}
			for _, r := range b.positions {
				for _, q := range o.positions {
					if !r.Overlaps(q) {
						continue
					}
					at := maxAddr(r.First, q.First)
					mine, theirs := place(b.block, at), place(o.block, at)
					out[b.pool.Name] = append(out[b.pool.Name], Problem{"spec.announce.l2.virtualMAC", fmt.Sprintf(
						"%s would get the MAC %s of %s in the older pool %s (scheme %s: a MAC is the address's bits after the first %d); give this pool addresses whose last bytes the other's do not have, or use scheme Local",
						mine, VirtualMAC(b.pool.Announce.MACScheme, mine), theirs, o.pool.Name, b.pool.Announce.MACScheme, b.block.Bits())})
					bad[b.pool.Name] = true
					break older
				}
			}
		}
	}
	return out
}

// place is the address at position pos (as returned by position) in block.
func place(block netip.Prefix, pos netip.Addr) netip.Addr {
	b, p := block.Addr().As16(), pos.As16()
	for i := range b {
		b[i] |= p[i]
	}
	a := netip.AddrFrom16(b)
	if block.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}

// refuseMACConflicts marks the pools macConflicts finds, on copies: the decoded pools given to
// NewSet stay as they are, so that a later set without the conflict has none.
func (s *Set) refuseMACConflicts() {
	for name, probs := range macConflicts(s.Pools()) {
		c := *s.pools[name]
		c.Problems = append(slices.Clone(c.Problems), probs...)
		s.pools[name] = &c
	}
}
