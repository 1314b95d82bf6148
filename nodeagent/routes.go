package nodeagent

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/metalvip/metalvip/nodeagent/bgp"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// applyBGPLocked gives the speaker the valid peers and the routes, and returns what it could
// not do. A peer gobgp refuses costs only that peer's session: the routes are set all the
// same. The control-plane file's peers join the CCM's (cp). The caller holds mu.
func (a *Agent) applyBGPLocked(ctx context.Context, st *agentv1.DesiredState, routes []bgp.Route, cp cpWire) []string {
	peers, problems := mergePeers(a.checked.peers, cp.peers)
	if len(peers) == 0 && len(routes) == 0 && a.bgp == nil {
		return nil
	}
	cfg := bgp.Config{ASN: cmp.Or(st.GetBgp().GetAsn(), cp.asn), RouterID: a.opts.RouterID, ListenPort: -1}
	if cfg.ASN == 0 && len(peers) > 0 {
		cfg.ASN = peers[0].LocalASN // every valid peer has one when the state gives no default
	}
	if id := st.GetBgp().GetRouterId(); id != "" {
		cfg.RouterID, _ = netip.ParseAddr(id)
	} else if cp.routerID.IsValid() {
		cfg.RouterID = cp.routerID
	}
	if a.bgp != nil && (a.bgpCfg.ASN != cfg.ASN || a.bgpCfg.RouterID != cfg.RouterID) && cfg.ASN != 0 {
		// Global settings cannot change under a running server: restart it.
		_ = a.bgp.Shutdown(ctx)
		a.bgp = nil
	}
	if a.bgp == nil {
		if a.opts.NewBGP == nil {
			return append(problems, "BGP: this agent has no BGP speaker")
		}
		if cfg.ASN == 0 {
			return append(problems, "BGP: bgp.asn is not set and no peer gives a local ASN: nothing to speak BGP as")
		}
		if !cfg.RouterID.IsValid() {
			return append(problems, "BGP: no router ID: the node has no IPv4 address to use; give the agent --router-id (a 32-bit ID unique among the peers, written as an IPv4 address)")
		}
		// A state resumed from disk: the routers may hold this node's routes from before the
		// restart (graceful restart); the speaker tells them it restarts.
		cfg.Restarting = a.restored
		s, err := a.opts.NewBGP(ctx, cfg)
		if err != nil {
			return append(problems, fmt.Sprintf("BGP: start the speaker: %v", err))
		}
		s.OnSessionChange(a.sessionChanged)
		a.bgp, a.bgpCfg = s, cfg
	}
	if err := a.bgp.SetPeers(ctx, peers); err != nil {
		problems = append(problems, "BGP peers: "+err.Error())
	}
	if err := a.bgp.SetRoutes(ctx, routes); err != nil {
		problems = append(problems, "BGP routes: "+err.Error())
	}
	return problems
}

func (a *Agent) sessionChanged(s bgp.SessionState) {
	kind := agentv1.Event_KIND_SESSION_DOWN
	if s.Established() {
		kind = agentv1.Event_KIND_SESSION_UP
	}
	a.emit(&agentv1.Event{Kind: kind, Peer: s.Peer.String(), Detail: strings.TrimSpace(s.State + " " + s.LastError)})
}
