package announcer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metalvip/metalvip/api/v1alpha1"
	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/loadbalancer/objects"
	"github.com/metalvip/metalvip/loadbalancer/pools"
	"github.com/metalvip/metalvip/loadbalancer/report"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// managerSessions owns a BGPPeer's status.sessions and status.nodes, apart from the
// announcer's conditions: a server-side apply owns exactly the fields it gives, so two writers
// under one manager would remove each other's.
const managerSessions = "metalvip-peer-sessions"

// Session states that no agent reports: the CCM says them.
const (
	SessionUnknown       = "Unknown"       // the CCM does not reach the node's agent
	SessionNotConfigured = "NotConfigured" // the agent runs no session with the peer
)

// maxPeerNodes is the most nodes a BGPPeer's status lists (status.nodes' MaxItems).
const maxPeerNodes = 5000

// peerSessionsStatus is the part of a BGPPeer's status the sessions writer owns.
type peerSessionsStatus struct {
	Sessions string                       `json:"sessions"`
	Nodes    []v1alpha1.BGPPeerNodeStatus `json:"nodes,omitempty"`
}

// PeerSessions builds a BGPPeer's per-node session status from what the agents reported:
// one entry per node the peer selects (nodes sorted by name), and a summary such as
// "Established 2/3". reachable tells whether the CCM reaches a node's agent; sessions are
// each node's sessions as its agent last reported them; left are the nodes where another
// (older) peer of the same address runs the session instead.
func PeerSessions(p *pools.Peer, nodes []string, reachable func(string) bool, sessions map[string][]*agentv1.PeerStatus, left map[string]bool) (string, []v1alpha1.BGPPeerNodeStatus) {
	var out []v1alpha1.BGPPeerNodeStatus
	up := 0
	key := agentapi.PeerKey(p.Session)
	for _, n := range nodes {
		st := v1alpha1.BGPPeerNodeStatus{Node: n, State: SessionNotConfigured}
		switch {
		case !reachable(n):
			st.State = SessionUnknown
		case left[n]:
			st.LastError = "another BGPPeer of the same address (or interface) runs the session on this node"
		default:
			for _, s := range sessions[n] {
				if agentapi.StatusKey(s) != key {
					continue
				}
				st.State, st.BFDState, st.LastError = s.GetState(), s.GetBfdState(), s.GetLastError()
				st.RoutesAdvertised = int32(min(s.GetRoutesAdvertised(), 1<<31-1))
				if s.GetSinceUnix() > 0 {
					t := metav1.NewTime(time.Unix(s.GetSinceUnix(), 0))
					st.Since = &t
				}
			}
		}
		if st.State == "Established" {
			up++
		}
		out = append(out, st)
	}
	return fmt.Sprintf("Established %d/%d", up, len(nodes)), out
}

// writePeerSessions applies each peer's sessions status when it changed.
func (a *Announcer) writePeerSessions() {
	s := &a.loop
	left := map[string]map[string]bool{}
	for node, cs := range s.conflicts {
		for _, c := range cs {
			if left[c.Peer] == nil {
				left[c.Peer] = map[string]bool{}
			}
			left[c.Peer][node] = true
		}
	}
	reachable := func(n string) bool { return s.reachable[n] }
	for _, p := range s.set.Peers() {
		if p.Name == "" {
			continue
		}
		var nodes []string
		for _, n := range s.nodeList {
			if p.Selects(n.Labels) {
				nodes = append(nodes, n.Name)
			}
		}
		sum, list := PeerSessions(p, nodes, reachable, s.sessions, left[p.Name])
		var b strings.Builder
		b.WriteString(sum)
		for _, n := range list {
			fmt.Fprintf(&b, ";%s|%s|%s|%d|%s|%v", n.Node, n.State, n.BFDState, n.RoutesAdvertised, n.LastError, n.Since)
		}
		key := "peer-sessions/" + p.Name
		if s.statusSet[key] == b.String() {
			continue
		}
		s.statusSet[key] = b.String()
		if len(list) > maxPeerNodes {
			list = list[:maxPeerNodes] // the CRD's bound; the summary counts every node
		}
		st := peerSessionsStatus{Sessions: sum, Nodes: list}
		name := p.Name
		a.writer.Set(key, func(ctx context.Context) error {
			return report.ApplyStatus(ctx, a.cfg.Dynamic, v1alpha1.BGPPeerResource, objects.KindPeer, name, &st, managerSessions)
		})
	}
	s.forgetStatus("peer-sessions/", func(name string) bool {
		return slices.ContainsFunc(s.set.Peers(), func(p *pools.Peer) bool { return p.Name == name })
	})
}
