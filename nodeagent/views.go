package nodeagent

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/nodeagent/dataplane"
	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// GetState reports what the agent applied and does now. It never returns a secret: BGP
// passwords are blanked, the heartbeat keys are public halves.
func (a *Agent) GetState(context.Context, *agentv1.GetStateRequest) (*agentv1.GetStateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &agentv1.GetStateResponse{
		Node:                a.opts.Node,
		Term:                a.state.GetTerm(),
		Generation:          a.state.GetGeneration(),
		Restored:            a.restored,
		Problems:            a.problemsLocked(),
		Refused:             cloneRefusals(a.checked.refused),
		UnknownFields:       slices.Clone(a.checked.unknown),
		HeartbeatPublicKeys: a.identity.PublicKeys(),
		Build:               agentapi.ThisBuild(),
	}
	if a.appliedBy != nil {
		resp.AppliedBy = proto.Clone(a.appliedBy).(*agentv1.Build)
	}
	if a.opts.ControlPlane != nil {
		resp.ControlPlane = a.opts.ControlPlane.status()
	}
	if a.state != nil {
		resp.State = withoutSecrets(a.state)
	}
	for vip, v := range a.views {
		c := proto.Clone(v).(*agentv1.AnnouncedVIP)
		if cl, ok := a.opts.L2.(interface {
			Clients(netip.Addr) (int, int)
		}); ok && len(c.Sharing) > 0 {
			known, answered := cl.Clients(vip)
			c.ClientsKnown, c.ClientsAnswered = uint32(known), uint32(answered)
		}
		resp.Announced = append(resp.Announced, c)
	}
	slices.SortFunc(resp.Announced, func(x, y *agentv1.AnnouncedVIP) int { return strings.Compare(x.GetVip(), y.GetVip()) })
	if a.bgp != nil {
		for _, s := range a.bgp.Sessions() {
			ps := &agentv1.PeerStatus{
				State: s.State, BfdState: s.BFDState, LastError: s.LastError, SinceUnix: s.Since.Unix(),
				RoutesAdvertised: uint32(min(s.RoutesAdvertised, 1<<32-1)),
			}
			if s.Interface != "" {
				ps.Interface = s.Interface
			} else {
				ps.Address = s.Peer.String()
			}
			resp.Peers = append(resp.Peers, ps)
		}
	}
	resp.L2, resp.Heartbeats = a.countersLocked()
	resp.Restarting = a.restartingLocked(time.Now())
	resp.DataPlane = dataPlaneOf(a.dataPlane.Status())
	resp.Egress = a.egressStatusLocked()
	return resp, nil
}

// dataPlaneOf is GetState's data_plane: nil when kube-proxy is not checked.
func dataPlaneOf(s dataplane.Status) *agentv1.DataPlane {
	if !s.Checked {
		return nil
	}
	dp := &agentv1.DataPlane{Ready: s.Ready, SinceUnixMillis: s.Since.UnixMilli()}
	if !s.Ready {
		dp.Detail = s.Detail
	}
	for _, p := range s.Serving {
		dp.ServingPorts = append(dp.ServingPorts, uint32(p))
	}
	for _, p := range s.Waiting {
		dp.WaitingPorts = append(dp.WaitingPorts, uint32(p))
	}
	return dp
}

// restartingLocked lists the nodes known to be in a planned restart at now, by name: this
// one after its notice, and the peers whose heartbeats said so. The caller holds mu.
func (a *Agent) restartingLocked(now time.Time) []*agentv1.RestartNotice {
	until := map[string]time.Time{}
	if a.live != nil {
		maps.Copy(until, a.live.View().Restarting(now))
	}
	if a.restartingUntil.After(now) {
		until[a.opts.Node] = a.restartingUntil
	}
	var out []*agentv1.RestartNotice
	for _, n := range slices.Sorted(maps.Keys(until)) {
		left := min(until[n].Sub(now), failover.MaxRestartGrace)
		out = append(out, &agentv1.RestartNotice{Node: n, GraceLeftMillis: uint32(left.Milliseconds())})
	}
	return out
}

// countersLocked returns the speaker's and the heartbeat monitors' counters so far. The
// caller holds mu.
func (a *Agent) countersLocked() (*agentv1.L2Counters, *agentv1.HeartbeatCounters) {
	var l2c *agentv1.L2Counters
	if a.opts.L2 != nil {
		c := a.opts.L2.Counters()
		l2c = &agentv1.L2Counters{
			ArpRequests: c.ARPRequests, ArpReplies: c.ARPReplies, GratuitousArps: c.GratuitousARPs,
			NeighborSolicitations: c.NeighborSolicitations, NeighborAdvertisements: c.NeighborAdvertisements,
			UnsolicitedAdvertisements: c.UnsolicitedAdvertisements, TargetedReplies: c.TargetedReplies,
		}
	}
	hb := a.hbBase
	if a.live != nil {
		hb = addCounters(hb, a.live.Counters())
	}
	return l2c, &agentv1.HeartbeatCounters{Sent: hb.Sent, Accepted: hb.Accepted, Unproven: hb.Unproven, Refused: hb.Refused, Stalls: hb.Stalls}
}

// withoutSecrets returns a copy of st without BGP passwords or the deprecated shared keys.
func withoutSecrets(st *agentv1.DesiredState) *agentv1.DesiredState {
	out := proto.Clone(st).(*agentv1.DesiredState)
	if out.L2 != nil {
		//lint:ignore SA1019 an older CCM may still send the shared key: it must not come back out
		out.L2.HeartbeatKeys = nil
	}
	for _, p := range out.BgpPeers {
		p.Password = ""
	}
	return out
}

// Watch streams events until the client goes away or the agent closes.
func (a *Agent) Watch(_ *agentv1.WatchRequest, stream agentv1.AgentService_WatchServer) error {
	ch := make(chan *agentv1.Event, 256)
	a.watchMu.Lock()
	a.watchers[ch] = struct{}{}
	a.watchMu.Unlock()
	defer func() {
		a.watchMu.Lock()
		delete(a.watchers, ch)
		a.watchMu.Unlock()
	}()
	// Headers tell the client the stream is registered: events from now on reach it.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-a.stop:
			return status.Error(codes.Unavailable, "agent shutting down")
		case ev := <-ch:
			if err := stream.Send(&agentv1.WatchResponse{Event: ev}); err != nil {
				return err
			}
		}
	}
}

// emit sends an event to every watcher; a watcher too slow to keep up loses it.
func (a *Agent) emit(ev *agentv1.Event) {
	ev.UnixNano = time.Now().UnixNano()
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	for ch := range a.watchers {
		select {
		case ch <- ev:
		default:
			klog.V(2).InfoS("Watcher too slow: event dropped", "kind", ev.GetKind())
		}
	}
}
