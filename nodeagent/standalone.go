package nodeagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/atomicfile"
	"github.com/metalvip/metalvip/nodeagent/bgp"
	"github.com/metalvip/metalvip/nodeagent/controlplane"
	"github.com/metalvip/metalvip/nodeagent/failover"
	"github.com/metalvip/metalvip/nodeagent/l2"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// The standalone mode: the control-plane VIP (kubeadm's --control-plane-endpoint) from a local
// file, the agent's second source of desired state beside the CCM's. It needs no API server
// and no CCM to start or to elect. The two sources stay apart: the CCM's Apply never removes
// the control-plane VIP (the agent adds it to whatever the CCM's state puts on the wire), a
// CCM announcement of the control-plane VIP is refused alone, and the local file never touches
// a Service VIP. GetState reports it in control_plane, never in state or announced.
//
// L2: two heartbeat exchanges among the control-plane nodes, with keys of their own (the
// control-plane folder of the state directory), never rotated, since the file is static. One,
// on the quorum port, runs among all of them always: a node holds the VIP only while a majority
// (itself included) see each other. The other, on the candidate port, runs among the nodes that
// may hold the VIP now (API server ready, not standby, with a majority): the ordered hand-over
// of owns() among them. An API server that fails takes its node out of the candidates (its
// heartbeats there stop), so the next one takes over one heartbeat deadline later, after the
// failing one has stopped answering.

// ControlPlaneDir is the folder of the state directory that holds the control-plane heartbeat
// identity and the bootstrap record.
const ControlPlaneDir = "control-plane"

const bootstrapFile = "bootstrap.json"

// ControlPlaneOptions configure a ControlPlane.
type ControlPlaneOptions struct {
	// File is the local file (controlplane.Config).
	File string
	// StateDir is the agent's state directory.
	StateDir string
	// Interfaces answer ARP/NDP when the file names none.
	Interfaces []string
	// NewLiveness opens a heartbeat exchange; nil means failover.New.
	NewLiveness func(failover.Config) (Liveness, error)
	// Check checks the local kube-apiserver once; nil means the file's /readyz.
	Check controlplane.Checker
	// Reload is how often the file is read again for changes; 0 means 1 s.
	Reload time.Duration
}

// ControlPlaneKey returns this node's control-plane heartbeat public key, making the identity
// if there is none yet: what `metalvip-agent --print-heartbeat-key` prints for the file.
func ControlPlaneKey(stateDir string) ([]byte, error) {
	if stateDir == "" {
		return nil, errors.New("no state directory: the key would not outlive this run")
	}
	id, err := failover.LoadIdentity(filepath.Join(stateDir, ControlPlaneDir), time.Now())
	if id == nil || err != nil {
		return nil, fmt.Errorf("heartbeat identity: %w", err)
	}
	return id.PublicKeys()[0], nil
}

// ControlPlane serves the control-plane VIP. Make it with NewControlPlane and give it to the
// agent (Options.ControlPlane), which starts it and stops it.
type ControlPlane struct {
	opts     ControlPlaneOptions
	identity *failover.Identity
	started  time.Time

	// decideMu serializes reconsider, which calls into the agent: taken before the agent's
	// locks, never while holding mu.
	decideMu sync.Mutex
	mu       sync.Mutex // guards what follows; a leaf lock
	spec     *controlplane.Spec
	fileSum  [32]byte
	check    controlplane.Checker
	quorum   Liveness // nil in BGP mode and for a single node
	cands    Liveness
	inCands  bool
	health   controlplane.Hysteresis
	detail   string
	record   bootstrapRecord
	decision cpDecision
	problems map[string]string // by kind: "file", "bootstrap record", "heartbeats"

	onChange func()
	emit     func(*agentv1.Event)
	stop     chan struct{}
	wg       sync.WaitGroup
}

// bootstrapRecord keeps, across restarts, that the bootstrap waivers ended.
type bootstrapRecord struct {
	APIServerReady time.Time `json:"apiServerReady,omitzero"`
	MajoritySeen   time.Time `json:"majoritySeen,omitzero"`
}

// NewControlPlane reads the file and this node's control-plane heartbeat identity. A file
// that does not check, or that gives this node a key other than its own, is an error: the
// agent does not start on it.
func NewControlPlane(opts ControlPlaneOptions) (*ControlPlane, error) {
	if opts.Reload <= 0 {
		opts.Reload = time.Second
	}
	if opts.NewLiveness == nil {
		opts.NewLiveness = func(c failover.Config) (Liveness, error) { return failover.New(c) }
	}
	data, err := os.ReadFile(opts.File)
	if err != nil {
		return nil, fmt.Errorf("control-plane file: %w", err)
	}
	spec, err := controlplane.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("control-plane file %s: %w", opts.File, err)
	}
	dir := ""
	if opts.StateDir != "" {
		dir = filepath.Join(opts.StateDir, ControlPlaneDir)
	}
	id, err := failover.LoadIdentity(dir, time.Now())
	if id == nil {
		return nil, fmt.Errorf("control-plane heartbeat identity: %w", err)
	}
	cp := &ControlPlane{opts: opts, identity: id, problems: map[string]string{}, stop: make(chan struct{})}
	if err != nil {
		// A new key: peers cannot hear this node until their files have it.
		klog.ErrorS(err, "Control-plane heartbeat identity")
		cp.problems["identity"] = err.Error()
	}
	if err := cp.ownKey(spec); err != nil {
		return nil, fmt.Errorf("control-plane file %s: %w", opts.File, err)
	}
	cp.spec, cp.fileSum = spec, sha256.Sum256(data)
	cp.health = controlplane.Hysteresis{Rise: spec.Health.Rise, Fall: spec.Health.Fall}
	cp.check = opts.Check
	if cp.check == nil {
		cp.check = controlplane.ReadyzChecker(spec.Health)
	}
	cp.detail = "not checked yet"
	cp.record = readBootstrapRecord(dir)
	return cp, nil
}

// Node is the node the file is for.
func (cp *ControlPlane) Node() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.spec.Self.Name
}

// ownKey checks that the file gives this node the key it has.
func (cp *ControlPlane) ownKey(s *controlplane.Spec) error {
	if s.Self.Key == nil || bytes.Equal(s.Self.Key, cp.identity.PublicKeys()[0]) {
		return nil
	}
	return fmt.Errorf("nodes: %s's heartbeatKey is not this node's key; its peers would not hear it. `metalvip-agent --print-heartbeat-key` prints the key of this state directory", s.Self.Name)
}

func readBootstrapRecord(dir string) bootstrapRecord {
	var r bootstrapRecord
	if dir == "" {
		return r
	}
	data, err := os.ReadFile(filepath.Join(dir, bootstrapFile))
	if err != nil {
		return r
	}
	if err := json.Unmarshal(data, &r); err != nil {
		// Fail closed: an unreadable record counts as bootstrap over, so that a node that
		// once had a majority never holds the VIP without one again.
		klog.ErrorS(err, "Control-plane bootstrap record does not parse; counting bootstrap as over")
		now := time.Now()
		r = bootstrapRecord{APIServerReady: now, MajoritySeen: now}
	}
	return r
}

// start opens the heartbeats and starts following the API server and the file. onChange puts
// the VIP's decision on the wire; it returns once it is there.
func (cp *ControlPlane) start(onChange func(), emit func(*agentv1.Event)) error {
	cp.onChange, cp.emit = onChange, emit
	cp.started = time.Now()
	cp.mu.Lock()
	err := cp.openLocked()
	cp.mu.Unlock()
	if err != nil {
		return err
	}
	klog.InfoS("Control-plane VIP", "file", cp.opts.File, "vip", cp.spec.VIP, "mode", cp.spec.Mode,
		"nodes", cp.spec.Names(), "bootstrap", cp.spec.Bootstrap, "standby", cp.spec.Standby)
	cp.wg.Add(2)
	go cp.followHealth()
	go cp.followFile()
	cp.reconsider()
	return nil
}

// openLocked opens the heartbeat exchanges of the spec. The caller holds mu.
func (cp *ControlPlane) openLocked() error {
	s := cp.spec
	if s.Mode != controlplane.ModeL2 || len(s.Members) < 2 {
		return nil
	}
	cfg := func(port uint16, misses int) failover.Config {
		return failover.Config{Node: s.Self.Name, Listen: netip.AddrPortFrom(s.Self.Addr, port),
			Interval: s.Interval, Misses: misses, Identity: cp.identity, OnChange: func(failover.View) { cp.reconsider() }}
	}
	q, err := cp.opts.NewLiveness(cfg(s.QuorumPort, s.Misses))
	if err != nil {
		return fmt.Errorf("control-plane quorum heartbeats: %w", err)
	}
	// The candidates wait one heartbeat longer than the majority does: a holder cut off from
	// the others has let go (it lost its majority) before another takes over.
	c, err := cp.opts.NewLiveness(cfg(s.CandidatePort, s.Misses+1))
	if err != nil {
		_ = q.Close()
		return fmt.Errorf("control-plane candidate heartbeats: %w", err)
	}
	q.SetPeers(cp.peersLocked())
	cp.quorum, cp.cands, cp.inCands = q, c, false
	return nil
}

func (cp *ControlPlane) peersLocked() []failover.Peer {
	var out []failover.Peer
	for _, m := range cp.spec.Others() {
		out = append(out, failover.Peer{Node: m.Name, Addr: m.Addr, PublicKeys: [][]byte{m.Key}})
	}
	return out
}

func (cp *ControlPlane) stopped() bool {
	select {
	case <-cp.stop:
		return true
	default:
		return false
	}
}

// close stops following and closes the heartbeats. The caller holds none of the agent's locks
// (a heartbeat's OnChange takes them).
func (cp *ControlPlane) close() {
	if cp.stopped() {
		return
	}
	close(cp.stop)
	cp.wg.Wait()
	cp.mu.Lock()
	q, c := cp.quorum, cp.cands
	cp.quorum, cp.cands = nil, nil
	cp.mu.Unlock()
	for _, l := range []Liveness{q, c} {
		if l != nil {
			_ = l.Close()
		}
	}
}

func (cp *ControlPlane) followHealth() {
	defer cp.wg.Done()
	for {
		cp.mu.Lock()
		h, check := cp.spec.Health, cp.check
		cp.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		err := check(ctx)
		cancel()
		cp.mu.Lock()
		ready, changed := cp.health.Observe(err == nil)
		if err == nil {
			cp.detail = "ok"
		} else {
			cp.detail = err.Error()
		}
		detail := cp.detail
		cp.mu.Unlock()
		if changed {
			klog.InfoS("Control-plane: local kube-apiserver", "ready", ready, "detail", detail)
		}
		cp.reconsider()
		select {
		case <-cp.stop:
			return
		case <-time.After(h.Interval):
		}
	}
}

func (cp *ControlPlane) followFile() {
	defer cp.wg.Done()
	t := time.NewTicker(cp.opts.Reload)
	defer t.Stop()
	for {
		select {
		case <-cp.stop:
			return
		case <-t.C:
			cp.reload()
		}
	}
}

// reload takes a changed file. A file that does not check changes nothing: the agent keeps the
// previous one and says why (log, GetState's control_plane.problems).
func (cp *ControlPlane) reload() {
	data, err := os.ReadFile(cp.opts.File)
	cp.mu.Lock()
	if err != nil {
		cp.problemLocked("file", fmt.Sprintf("cannot read %s: %v; still using the file as it was", cp.opts.File, err))
		cp.mu.Unlock()
		return
	}
	sum := sha256.Sum256(data)
	if sum == cp.fileSum {
		delete(cp.problems, "file")
		cp.mu.Unlock()
		return
	}
	spec, err := controlplane.Parse(data)
	if err == nil {
		err = cp.ownKey(spec)
	}
	if err == nil && spec.Self.Name != cp.spec.Self.Name {
		err = fmt.Errorf("node: %q, but this agent is %q", spec.Self.Name, cp.spec.Self.Name)
	}
	if err != nil {
		cp.problemLocked("file", fmt.Sprintf("%s changed and is refused: %v; still using the file as it was", cp.opts.File, err))
		cp.mu.Unlock()
		return
	}
	delete(cp.problems, "file")
	old := cp.spec
	cp.spec, cp.fileSum = spec, sum
	cp.health.Rise, cp.health.Fall = spec.Health.Rise, spec.Health.Fall
	if cp.opts.Check == nil && spec.Health != old.Health {
		cp.check = controlplane.ReadyzChecker(spec.Health)
	}
	var closing []Liveness
	if !old.SameHeartbeats(spec) {
		closing = []Liveness{cp.quorum, cp.cands}
		cp.quorum, cp.cands, cp.inCands = nil, nil, false
	}
	cp.mu.Unlock()
	klog.InfoS("Control-plane file changed", "file", cp.opts.File, "vip", spec.VIP, "mode", spec.Mode,
		"nodes", spec.Names(), "standby", spec.Standby, "newHeartbeats", closing != nil)
	if closing != nil {
		// Outside mu and decideMu: a closing monitor may be calling reconsider.
		for _, l := range closing {
			if l != nil {
				_ = l.Close()
			}
		}
		cp.mu.Lock()
		if err := cp.openLocked(); err != nil {
			cp.problemLocked("heartbeats", err.Error())
		} else {
			delete(cp.problems, "heartbeats")
		}
		cp.mu.Unlock()
	}
	cp.reconsider()
}

func (cp *ControlPlane) problemLocked(kind, p string) {
	if cp.problems[kind] != p {
		klog.ErrorS(nil, "Control-plane VIP", "problem", p)
	}
	cp.problems[kind] = p
}

// reconsider decides again and, when the decision changed, puts it on the wire. A node that
// becomes eligible joins the candidates' heartbeats before it decides (it must hear the
// others first); one that stops being eligible leaves them only after it stopped answering.
func (cp *ControlPlane) reconsider() {
	cp.decideMu.Lock()
	defer cp.decideMu.Unlock()
	if cp.stopped() {
		return
	}
	cp.mu.Lock()
	d := cp.decideLocked(time.Now())
	if d.Eligible && !cp.inCands && cp.cands != nil {
		cp.cands.SetPeers(cp.peersLocked())
		cp.inCands = true
		d = cp.decideLocked(time.Now())
	}
	prev := cp.decision
	cp.decision = d
	vip := cp.spec.VIP.String()
	cp.mu.Unlock()
	if d != prev {
		klog.InfoS("Control-plane VIP", "vip", vip, "active", d.Active, "reason", d.Reason)
		cp.onChange()
		switch {
		case d.Active && !prev.Active:
			cp.emit(&agentv1.Event{Kind: agentv1.Event_KIND_TOOK_OVER, Vip: vip, Detail: "control plane: " + d.Reason})
		case !d.Active && prev.Active:
			cp.emit(&agentv1.Event{Kind: agentv1.Event_KIND_RELEASED, Vip: vip, Detail: "control plane: " + d.Reason})
		}
	}
	if !d.Eligible {
		cp.mu.Lock()
		if cp.inCands && cp.cands != nil {
			cp.cands.SetPeers(nil)
		}
		cp.inCands = false
		cp.mu.Unlock()
	}
}

// decideLocked gathers the facts and decides; it keeps the bootstrap record. The caller holds
// mu.
func (cp *ControlPlane) decideLocked(now time.Time) cpDecision {
	s := cp.spec
	f := cpFacts{
		self: s.Self.Name, ranked: s.Names(), mode: s.Mode,
		ready: cp.health.Ready(), detail: cp.detail, standby: s.Standby,
	}
	if cp.quorum != nil {
		q := cp.quorum.View()
		for _, m := range s.Others() {
			if q.Alive(m.Name) && q.Sees(m.Name) {
				f.seen++
			}
		}
	}
	if cp.inCands {
		f.cands = cp.cands.View()
	}
	changed := false
	if f.ready && cp.record.APIServerReady.IsZero() {
		cp.record.APIServerReady, changed = now, true
	}
	if len(s.Members) > 1 && f.seen+1 >= s.Majority() && cp.record.MajoritySeen.IsZero() {
		cp.record.MajoritySeen, changed = now, true
	}
	if changed {
		cp.saveRecordLocked()
	}
	if s.Bootstrap {
		// A node that just started first listens for one heartbeat deadline (twice over):
		// if a majority is there, it is no first node.
		listened := len(s.Members) < 2 || now.Sub(cp.started) >= 2*time.Duration(s.Misses)*s.Interval
		f.quorumWaived = listened && cp.record.MajoritySeen.IsZero()
		f.healthWaived = f.quorumWaived && cp.record.APIServerReady.IsZero()
	}
	d := decideControlPlane(f)
	if d.Active && s.Mode == controlplane.ModeL2 && len(s.Members) > 1 && !cp.inCands {
		// owns() without heartbeats would make the first candidate answer: not here, where the
		// others' heartbeats exist and are not heard yet.
		d.Active, d.Reason = false, "waiting for the candidates' heartbeats"
	}
	return d
}

func (cp *ControlPlane) saveRecordLocked() {
	if cp.opts.StateDir == "" {
		return
	}
	data, _ := json.Marshal(cp.record)
	if err := atomicfile.Write(filepath.Join(cp.opts.StateDir, ControlPlaneDir), bootstrapFile, data); err != nil {
		cp.problemLocked("bootstrap record", fmt.Sprintf("cannot save %s: %v; a restarted agent may take bootstrap for not over", bootstrapFile, err))
	}
}

// cpWire is what the control-plane VIP puts on the wire now.
type cpWire struct {
	vip      netip.Addr
	l2       []l2.VIP
	routes   []bgp.Route
	peers    []bgp.Peer
	asn      uint32
	routerID netip.Addr
}

func (cp *ControlPlane) wire() cpWire {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s := cp.spec
	w := cpWire{vip: s.VIP}
	switch s.Mode {
	case controlplane.ModeBGP:
		w.peers, w.asn, w.routerID = s.Peers, s.ASN, s.RouterID
		if cp.decision.Active {
			w.routes = []bgp.Route{{Prefix: netip.PrefixFrom(s.VIP, s.VIP.BitLen())}}
		}
	case controlplane.ModeL2:
		if cp.decision.Active {
			w.l2 = []l2.VIP{{Addr: s.VIP, Interfaces: cp.interfacesLocked()}}
		}
	}
	return w
}

func (cp *ControlPlane) interfacesLocked() []string {
	if len(cp.spec.Interfaces) > 0 {
		return cp.spec.Interfaces
	}
	return cp.opts.Interfaces
}

// status is the control-plane VIP for GetState.
func (cp *ControlPlane) status() *agentv1.ControlPlaneStatus {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s := cp.spec
	mode := agentv1.Mode_MODE_L2
	if s.Mode == controlplane.ModeBGP {
		mode = agentv1.Mode_MODE_BGP
	}
	st := &agentv1.ControlPlaneStatus{
		ConfigFile:      cp.opts.File,
		Vip:             &agentv1.AnnouncedVIP{Vip: s.VIP.String(), Mode: mode, Active: cp.decision.Active, Reason: cp.decision.Reason},
		ApiServerReady:  cp.health.Ready(),
		ApiServerDetail: cp.detail,
		Nodes:           s.Names(),
	}
	if mode == agentv1.Mode_MODE_L2 {
		st.Vip.Interfaces = cp.interfacesLocked()
		st.Majority = uint32(s.Majority())
	}
	if cp.quorum != nil {
		q := cp.quorum.View()
		for _, m := range s.Others() {
			if q.Alive(m.Name) && q.Sees(m.Name) {
				st.Seen = append(st.Seen, m.Name)
			}
		}
	}
	st.Bootstrap = s.Bootstrap && cp.record.MajoritySeen.IsZero() && (len(s.Members) > 1 || cp.record.APIServerReady.IsZero())
	for _, p := range cp.problems {
		st.Problems = append(st.Problems, p)
	}
	slices.Sort(st.Problems)
	return st
}

// The agent's side of the second source.
