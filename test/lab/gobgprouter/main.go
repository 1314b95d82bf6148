// Command gobgprouter is the lab's second router implementation (lab.Options.Router =
// lab.RouterGoBGP): a gobgp v4 server in the router's namespace that accepts the nodes'
// sessions from the segment's ranges (dynamic neighbors, as FRR's listen ranges), runs BFD
// and graceful restart (helper) with them, and installs what it learns into the namespace's
// kernel table the way FRR's zebra does, so that the lab's traffic and its route sampling work
// unchanged: one route per prefix over every equal-cost next hop (the same LOCAL_PREF and AS
// path length; paths carrying GRACEFUL_SHUTDOWN, 65535:0, only when no other is left).
//
// It prints one line per change of an installed route ("ROUTE 203.0.113.1/32 [198.51.100.11
// 198.51.100.12]", "[]" when gone), one per change of a BFD session's state ("BFD
// 198.51.100.11 up"), and "READY" once it listens. SIGTERM stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/vishvananda/netlink"
)

func main() {
	var (
		asn, peerASN uint32
		routerID     string
		ranges       string
		bfdMS        uint
		holdTime     uint
		multihopTTL  uint
		noFIB        bool
	)
	flag.Func("asn", "the router's AS number", func(s string) error { _, err := fmt.Sscan(s, &asn); return err })
	flag.Func("peer-asn", "the nodes' AS number (the router's own: iBGP)", func(s string) error { _, err := fmt.Sscan(s, &peerASN); return err })
	flag.StringVar(&routerID, "router-id", "", "the router ID")
	flag.StringVar(&ranges, "ranges", "", "comma-separated prefixes whose addresses may open a session")
	flag.UintVar(&bfdMS, "bfd-interval-ms", 100, "BFD transmit and receive interval (detect multiplier 3); 0: no BFD")
	flag.UintVar(&holdTime, "hold-time", 9, "BGP hold time in seconds (keepalive: a third)")
	flag.UintVar(&multihopTTL, "multihop-ttl", 0, "accept eBGP peers this many hops away (0: directly connected)")
	flag.BoolVar(&noFIB, "no-fib", false, "print the routes it would install without installing them (a router off the data path)")
	flag.Parse()
	if err := run(asn, peerASN, routerID, strings.Split(ranges, ","), bfdMS, holdTime, uint32(multihopTTL), noFIB); err != nil {
		fmt.Fprintln(os.Stderr, "gobgprouter:", err)
		os.Exit(1)
	}
}

func run(asn, peerASN uint32, routerID string, ranges []string, bfdMS, holdTime uint, multihopTTL uint32, noFIB bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := server.NewBgpServer(server.LoggerOption(logger, nil))
	go s.Serve()
	defer s.Stop()

	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: asn, RouterId: routerID, ListenPort: 179}}); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	var families []*api.AfiSafi
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		families = append(families, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		})
	}
	group := &api.PeerGroup{
		Conf:            &api.PeerGroupConf{PeerGroupName: "nodes", PeerAsn: peerASN},
		Timers:          &api.Timers{Config: &api.TimersConfig{HoldTime: uint64(holdTime), KeepaliveInterval: uint64(max(holdTime/3, 1))}},
		GracefulRestart: &api.GracefulRestart{Enabled: true, HelperOnly: true, RestartTime: 120},
		AfiSafis:        families,
		// Nothing goes back to the nodes: the router is where their routes end.
		ApplyPolicy: &api.ApplyPolicy{ExportPolicy: &api.PolicyAssignment{DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT}},
	}
	if multihopTTL > 0 {
		group.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: multihopTTL}
	}
	if bfdMS > 0 {
		us := uint32(bfdMS * 1000)
		group.Bfd = &api.BfdPeerConfig{Enabled: true, DesiredMinimumTxInterval: us, RequiredMinimumReceive: us, DetectionMultiplier: 3}
	}
	if err := s.AddPeerGroup(ctx, &api.AddPeerGroupRequest{PeerGroup: group}); err != nil {
		return fmt.Errorf("peer group: %w", err)
	}
	for _, r := range ranges {
		if err := s.AddDynamicNeighbor(ctx, &api.AddDynamicNeighborRequest{DynamicNeighbor: &api.DynamicNeighbor{Prefix: r, PeerGroup: "nodes"}}); err != nil {
			return fmt.Errorf("range %s: %w", r, err)
		}
	}
	fmt.Println("READY")

	installed := map[netip.Prefix][]netip.Addr{}
	bfd := map[string]string{}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s.ListBfdPeer(ctx, func(addr string, st *api.BfdPeerState) {
			state := strings.ToLower(strings.TrimPrefix(st.GetSessionState().String(), "BFD_SESSION_STATE_"))
			if bfd[addr] != state {
				bfd[addr] = state
				fmt.Printf("BFD %s %s\n", addr, state)
			}
		})
		want := map[netip.Prefix][]netip.Addr{}
		for _, f := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
			err := s.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: f}, func(n bgp.NLRI, paths []*apiutil.Path) {
				p, err := netip.ParsePrefix(n.String())
				if err != nil {
					return
				}
				if hops := equalCost(paths); len(hops) > 0 {
					want[p] = hops
				}
			})
			if err != nil {
				return fmt.Errorf("list paths: %w", err)
			}
		}
		for p, hops := range want {
			if slices.Equal(installed[p], hops) {
				continue
			}
			if err := install(p, hops, noFIB); err != nil {
				fmt.Fprintf(os.Stderr, "install %s via %v: %v\n", p, hops, err)
				continue
			}
			installed[p] = hops
			fmt.Printf("ROUTE %s %v\n", p, hops)
		}
		for p := range installed {
			if _, ok := want[p]; ok {
				continue
			}
			if noFIB {
				// nothing installed
			} else if err := netlink.RouteDel(&netlink.Route{Dst: ipNet(p), Protocol: routeProto}); err != nil {
				fmt.Fprintf(os.Stderr, "remove %s: %v\n", p, err)
			}
			delete(installed, p)
			fmt.Printf("ROUTE %s []\n", p)
		}
	}
}

// routeProto marks the routes this router installs (iproute2 calls 186 "bgp").
const routeProto = netlink.RouteProtocol(186)

// equalCost picks the next hops a destination's paths spread over: the paths without
// GRACEFUL_SHUTDOWN if any (else those with it), then the highest LOCAL_PREF, then the
// shortest AS path.
func equalCost(paths []*apiutil.Path) []netip.Addr {
	type cand struct {
		hop       netip.Addr
		gshut     bool
		localPref uint32
		asPathLen int
	}
	var cs []cand
	for _, p := range paths {
		if p.Withdrawal || p.Filtered || p.IsNexthopInvalid {
			continue
		}
		c := cand{localPref: 100}
		for _, a := range p.Attrs {
			switch a := a.(type) {
			case *bgp.PathAttributeNextHop:
				c.hop = a.Value
			case *bgp.PathAttributeMpReachNLRI:
				c.hop = a.Nexthop
			case *bgp.PathAttributeLocalPref:
				c.localPref = a.Value
			case *bgp.PathAttributeAsPath:
				for _, seg := range a.Value {
					c.asPathLen += len(seg.GetAS())
				}
			case *bgp.PathAttributeCommunities:
				c.gshut = slices.Contains(a.Value, 0xFFFF0000)
			}
		}
		if c.hop.IsValid() {
			cs = append(cs, c)
		}
	}
	if slices.ContainsFunc(cs, func(c cand) bool { return !c.gshut }) {
		cs = slices.DeleteFunc(cs, func(c cand) bool { return c.gshut })
	}
	if len(cs) == 0 {
		return nil
	}
	best := cs[0]
	for _, c := range cs[1:] {
		if c.localPref > best.localPref || c.localPref == best.localPref && c.asPathLen < best.asPathLen {
			best = c
		}
	}
	var hops []netip.Addr
	for _, c := range cs {
		if c.localPref == best.localPref && c.asPathLen == best.asPathLen && !slices.Contains(hops, c.hop) {
			hops = append(hops, c.hop)
		}
	}
	slices.SortFunc(hops, netip.Addr.Compare)
	return hops
}

func install(p netip.Prefix, hops []netip.Addr, noFIB bool) error {
	if noFIB {
		return nil
	}
	r := &netlink.Route{Dst: ipNet(p), Protocol: routeProto}
	if len(hops) == 1 {
		r.Gw = hops[0].AsSlice()
	} else {
		for _, h := range hops {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: h.AsSlice()})
		}
	}
	return netlink.RouteReplace(r)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
