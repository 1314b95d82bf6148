package nodeagent

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/nodeagent/failover"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// Observer is told what the agent does, as it happens, for metrics. Its methods must not block
// and must not call the agent: they run with the agent's lock held.
type Observer interface {
	// Applied is an Apply that changed the state; refused is how many of its items were
	// refused (validate.go), 0 when all were taken.
	Applied(refused int)
	// TookOver is this node starting to answer for an L2 VIP. after is the time since the
	// node that answered before was last proven alive, when the takeover followed its death;
	// 0 when it did not (a new VIP, a new plan).
	TookOver(vip netip.Addr, after time.Duration)
	// Released is this node no longer answering for an L2 VIP.
	Released(vip netip.Addr)
	// HeartbeatRTT is a heartbeat's round trip (see failover.Config.OnRTT).
	HeartbeatRTT(time.Duration)
}

type noObserver struct{}

func (noObserver) Applied(int)                        {}
func (noObserver) TookOver(netip.Addr, time.Duration) {}
func (noObserver) Released(netip.Addr)                {}
func (noObserver) HeartbeatRTT(time.Duration)         {}

// deadAheadLocked returns, for a VIP this node now answers, when the latest of the dead
// candidates ranked ahead of it was last proven alive: a takeover after that node's death.
// The caller holds mu.
func (a *Agent) deadAheadLocked(cands []string, live failover.View) (time.Time, bool) {
	var latest time.Time
	for _, c := range cands {
		if c == a.opts.Node {
			break
		}
		if live.Alive(c) {
			continue
		}
		if t, ok := live.LastAlive(c); ok && t.After(latest) {
			latest = t
		}
	}
	return latest, !latest.IsZero()
}

// Gauges are what the agent holds now, for metrics read at scrape time.
type Gauges struct {
	// L2Answered and L2Standby count L2 VIPs this node answers for and stands by for.
	L2Answered, L2Standby int
	// BGPRoutes counts the VIPs this node announces by BGP.
	BGPRoutes int
	// HeartbeatPeers and HeartbeatPeersAlive count the nodes heartbeats are exchanged with.
	HeartbeatPeers, HeartbeatPeersAlive int
	// BGPSessions counts the BGP sessions by state (gobgp's names: "established", "idle"...).
	BGPSessions map[string]int
	// Refused is how many items of the held state were refused; Problems how many problems
	// applying it are outstanding.
	Refused, Problems int
	// Generation and Term are those of the held state (0 without one).
	Generation, Term uint64
	// StateSaved: the held state is on disk (false when the last Apply could not save it).
	StateSaved bool
	// L2 and Heartbeats are the speaker's and the heartbeat monitors' counters so far.
	L2         *agentv1.L2Counters
	Heartbeats *agentv1.HeartbeatCounters
	// Egress is, for each egress VIP this node is the egress node of now, its Services and
	// the connections source-NATed to it.
	Egress []EgressFlows
}

// EgressFlows counts the connections a node source-NATed to an egress VIP.
type EgressFlows struct {
	VIP      string
	Services string // namespace/name, comma-separated
	Flows    uint64
}

// Gauges returns what the agent holds now. Unlike GetState it copies no VIP or state.
func (a *Agent) Gauges() Gauges {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := Gauges{
		Refused: len(a.checked.refused), Problems: len(a.problemsLocked()),
		Generation: a.state.GetGeneration(), Term: a.state.GetTerm(), StateSaved: a.unsaved == "",
		BGPSessions: map[string]int{},
	}
	for _, v := range a.views {
		switch {
		case v.GetMode() == agentv1.Mode_MODE_BGP:
			if v.GetActive() {
				g.BGPRoutes++
			}
		case v.GetActive():
			g.L2Answered++
		default:
			g.L2Standby++
		}
	}
	if a.live != nil {
		g.HeartbeatPeers = a.hbPeers
		g.HeartbeatPeersAlive = len(a.facts.AliveNodes())
	}
	if a.bgp != nil {
		for _, s := range a.bgp.Sessions() {
			g.BGPSessions[s.State]++
		}
	}
	g.L2, g.Heartbeats = a.countersLocked()
	services := map[string]string{}
	for _, eg := range a.checked.egress {
		services[eg.vip.String()] = strings.Join(eg.GetServices(), ",")
	}
	for _, st := range a.egressStatusLocked() {
		if st.GetActive() {
			g.Egress = append(g.Egress, EgressFlows{VIP: st.GetVip(), Services: services[st.GetVip()], Flows: st.GetFlows()})
		}
	}
	return g
}

// Healthy reports whether the agent can still announce: it is not closing and its state lock
// is not held for longer than wait (a stuck agent answers no change). At most one check
// waits at a time, so a stuck agent does not pile up goroutines.
func (a *Agent) Healthy(wait time.Duration) error {
	if a.closing() {
		return errClosing
	}
	a.healthMu.Lock()
	if a.healthWait == nil {
		ch := make(chan struct{})
		a.healthWait = ch
		go func() {
			a.mu.Lock()
			//lint:ignore SA2001 only waiting for the lock to be free
			a.mu.Unlock()
			a.healthMu.Lock()
			a.healthWait = nil
			a.healthMu.Unlock()
			close(ch)
		}()
	}
	ch := a.healthWait
	a.healthMu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return errStuck
	}
}

var (
	errClosing = healthError("the agent is shutting down")
	errStuck   = healthError("the agent's state has been locked too long: it is stuck and applies nothing")
)

type healthError string

func (e healthError) Error() string { return string(e) }

// healthState is embedded in Agent.
type healthState struct {
	healthMu   sync.Mutex
	healthWait chan struct{}
}
