package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

// ResilientOptions shape the router's resilient next-hop group (Linux 5.13 and later; see
// the kernel's Documentation/networking/nexthop-group-resilient.rst).
type ResilientOptions struct {
	// Buckets in the group's hash table; default 512. Each flow hashes to one bucket, and
	// each bucket forwards to one next hop.
	Buckets int
	// IdleTimer: a bucket that carried no packet for this long may move to another next hop
	// when the weights change; default 1 s. A busy bucket never moves while its next hop stays
	// in the group (the unbalanced timer is 0: never forced).
	IdleTimer time.Duration
}

// ResilientECMP forwards the router's traffic to one prefix over a resilient next-hop group
// that follows FRR's route: the next hops and weights FRR installs in the main table are
// copied, every 20 ms, into a resilient group, to which a route in a table of its own points,
// chosen by a rule before the main table. A next hop that leaves the group gives its buckets
// to the others at once; a change of weights moves only idle buckets; every other flow stays
// where it was. FRR (8.4 here, and later versions for BGP routes) installs only hash-threshold
// groups, where any change rehashes flows, so this stands in for the FIB of a router with
// resilient hashing (Arista, Juniper, Cumulus on Spectrum) while FRR keeps making every
// routing decision.
type ResilientECMP struct {
	Prefix  netip.Prefix
	Options ResilientOptions

	lab    *Lab
	table  string
	group  uint32
	hopIDs map[netip.Addr]uint32 // the nexthop object of each next hop
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changes []GroupChange
	hops    int // in the group now
	err     error
}

// GroupChange is one change the group followed: when, and the next hops with their weights
// ("" when FRR had no route).
type GroupChange struct {
	At    time.Time
	Group string
}

// resilientTable is the routing table of the resilient routes.
const resilientTable = 4242

// topNexthopID is the id of the first nexthop object the lab makes; each next one is 1 lower.
// zebra numbers its own objects above the highest id it has seen in the kernel, so ids that
// only go down never meet one of zebra's; and zebra's per-protocol ranges end far below.
const topNexthopID = 0xF0000000

// newNexthopID returns an id below every one the lab made before.
func (l *Lab) newNexthopID() uint32 {
	if l.nexthopIDs == 0 {
		l.nexthopIDs = topNexthopID
	}
	l.nexthopIDs--
	return l.nexthopIDs
}

// StartResilientECMP starts following FRR's route to prefix; it stops at Stop or when the test
// ends (and after 30 minutes at most).
func (l *Lab) StartResilientECMP(t testenv.TB, prefix netip.Prefix, o ResilientOptions) *ResilientECMP {
	t.Helper()
	if o.Buckets == 0 {
		o.Buckets = 512
	}
	if o.IdleTimer == 0 {
		o.IdleTimer = time.Second
	}
	if o.IdleTimer < time.Second || o.IdleTimer%time.Second != 0 {
		t.Fatalf("lab: idle timer %s: give whole seconds, at least 1 s", o.IdleTimer)
	}
	fam := "-4"
	if prefix.Addr().Is6() {
		fam = "-6"
	}
	l.mu.Lock()
	r := &ResilientECMP{Prefix: prefix, Options: o, lab: l, table: strconv.Itoa(resilientTable),
		group: l.newNexthopID(), hopIDs: map[netip.Addr]uint32{}, done: make(chan struct{})}
	l.mu.Unlock()
	if _, err := r.ip(fam, "rule", "add", "to", prefix.String(), "lookup", r.table, "pref", "100"); err != nil {
		t.Fatalf("lab: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	r.cancel = cancel
	go r.follow(ctx)
	t.Cleanup(r.Stop)
	return r
}

// Stop stops following FRR's route; the group and the route stay as they are.
func (r *ResilientECMP) Stop() {
	r.cancel()
	<-r.done
}

// Changes returns the changes the group followed, and the first error in following it.
func (r *ResilientECMP) Changes() ([]GroupChange, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.changes), r.err
}

// Hops returns how many next hops the group has now (0 before FRR has a route).
func (r *ResilientECMP) Hops() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hops
}

// WaitHops waits until the group has n next hops, and fails the test with the last error in
// following FRR's route when it does not within timeout.
func (r *ResilientECMP) WaitHops(t testenv.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for r.Hops() != n {
		if time.Now().After(deadline) {
			_, err := r.Changes()
			t.Fatalf("lab: the resilient group for %s has %d next hops after %s, want %d (error: %v)", r.Prefix, r.Hops(), timeout, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Buckets counts the group's buckets by next hop.
func (r *ResilientECMP) Buckets() (map[netip.Addr]int, error) {
	hops, err := r.BucketHops()
	if err != nil {
		return nil, err
	}
	counts := map[netip.Addr]int{}
	for _, a := range hops {
		counts[a]++
	}
	return counts, nil
}

// BucketHops returns the next hop of each of the group's buckets, by index.
func (r *ResilientECMP) BucketHops() ([]netip.Addr, error) {
	out, err := r.ip("-j", "nexthop", "bucket", "show", "id", strconv.FormatUint(uint64(r.group), 10))
	if err != nil {
		return nil, err
	}
	var buckets []struct {
		Bucket struct {
			Index int    `json:"index"`
			NHID  uint32 `json:"nhid"`
		} `json:"bucket"`
	}
	if err := json.Unmarshal(out, &buckets); err != nil {
		return nil, fmt.Errorf("nexthop buckets: %w: %s", err, out)
	}
	byID := map[uint32]netip.Addr{}
	r.mu.Lock()
	for a, id := range r.hopIDs {
		byID[id] = a
	}
	r.mu.Unlock()
	hops := make([]netip.Addr, len(buckets))
	for _, b := range buckets {
		if b.Bucket.Index < 0 || b.Bucket.Index >= len(hops) {
			return nil, fmt.Errorf("nexthop bucket index %d of %d", b.Bucket.Index, len(hops))
		}
		hops[b.Bucket.Index] = byID[b.Bucket.NHID]
	}
	return hops, nil
}

func (r *ResilientECMP) follow(ctx context.Context) {
	defer close(r.done)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := "-"
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		weights, _, err := r.lab.RouteWeights(r.Prefix.String())
		if err != nil {
			r.fail(err)
			continue
		}
		group := groupSpec(weights, r.hopID)
		if group == last {
			continue
		}
		if err := r.install(weights, group); err != nil {
			r.fail(err)
			continue
		}
		last = group
		r.mu.Lock()
		r.changes = append(r.changes, GroupChange{At: time.Now(), Group: describeGroup(weights)})
		r.hops = len(weights)
		r.mu.Unlock()
	}
}

func (r *ResilientECMP) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

// hopID is the id of a next hop's nexthop object, made on first use.
func (r *ResilientECMP) hopID(a netip.Addr) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.hopIDs[a]
	if !ok {
		r.lab.mu.Lock()
		id = r.lab.newNexthopID()
		r.lab.mu.Unlock()
		r.hopIDs[a] = id
	}
	return id
}

// groupSpec is the group as ip nexthop takes it, "id,weight/id,weight", in id order.
func groupSpec(weights map[netip.Addr]int, id func(netip.Addr) uint32) string {
	var parts []string
	for _, a := range slices.SortedFunc(func(yield func(netip.Addr) bool) {
		for a := range weights {
			if !yield(a) {
				return
			}
		}
	}, netip.Addr.Compare) {
		parts = append(parts, fmt.Sprintf("%d,%d", id(a), max(weights[a], 1)))
	}
	return strings.Join(parts, "/")
}

func describeGroup(weights map[netip.Addr]int) string {
	var parts []string
	for a, w := range weights {
		parts = append(parts, fmt.Sprintf("%s weight %d", a, w))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// install makes the group and the route match FRR's next hops. New next hops are added
// before the group names them; the group is replaced in place (its buckets stay), never
// deleted while the route uses it.
func (r *ResilientECMP) install(weights map[netip.Addr]int, group string) error {
	gid := strconv.FormatUint(uint64(r.group), 10)
	if len(weights) == 0 {
		_, err := r.ip("route", "del", r.Prefix.String(), "table", r.table)
		if err != nil && (strings.Contains(err.Error(), "No such process") || strings.Contains(err.Error(), "FIB table does not exist")) {
			err = nil // no route yet
		}
		return err
	}
	for a := range weights {
		if _, err := r.ip("nexthop", "replace", "id", strconv.FormatUint(uint64(r.hopID(a)), 10), "via", a.String(), "dev", "eth0"); err != nil {
			return err
		}
	}
	idle := strconv.Itoa(int(r.Options.IdleTimer / time.Second))
	if _, err := r.ip("nexthop", "replace", "id", gid, "group", group, "type", "resilient",
		"buckets", strconv.Itoa(r.Options.Buckets), "idle_timer", idle, "unbalanced_timer", "0"); err != nil {
		return err
	}
	_, err := r.ip("route", "replace", r.Prefix.String(), "nhid", gid, "table", r.table)
	return err
}

func (r *ResilientECMP) ip(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", r.lab.Router.NS}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}
