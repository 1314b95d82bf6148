package announcer

import (
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// drains follows the nodes being drained: when each drain began (as this CCM saw it), whose
// delay is over, and a timer per drain that wakes the loop at the end of its delay. It owns
// that and nothing else; only the loop calls it.
type drains struct {
	delay  time.Duration
	wake   func() // called by a drain's timer at the end of its delay
	since  map[string]time.Time
	ended  map[string]bool
	timers map[string]*time.Timer
}

func newDrains(delay time.Duration, wake func()) *drains {
	return &drains{delay: delay, wake: wake, since: map[string]time.Time{}, ended: map[string]bool{}, timers: map[string]*time.Timer{}}
}

// observe notes which of nodes are draining at now, and returns those whose delay has just
// ended (their lingering announcements are to be rebuilt without them). A node no longer in
// nodes, or no longer draining, ends its drain.
func (d *drains) observe(now time.Time, nodes []*v1.Node, draining func(*v1.Node) bool) (over []string) {
	known := map[string]bool{}
	for _, n := range nodes {
		known[n.Name] = true
		since, began := d.since[n.Name]
		switch dr := draining(n); {
		case dr && !began:
			d.since[n.Name] = now
			klog.InfoS("Node is being drained: it takes no new VIP, and withdraws what it announces after the delay", "node", n.Name, "delay", d.delay)
			d.timers[n.Name] = time.AfterFunc(d.delay+10*time.Millisecond, d.wake)
		case dr && !d.ended[n.Name] && !now.Before(since.Add(d.delay)):
			d.ended[n.Name] = true
			klog.InfoS("Drain delay over: the node withdraws what it announced", "node", n.Name)
			over = append(over, n.Name)
		case !dr && began:
			d.end(n.Name)
		}
	}
	for name := range d.since {
		if !known[name] {
			d.end(name)
		}
	}
	return over
}

func (d *drains) end(node string) {
	if t := d.timers[node]; t != nil {
		t.Stop()
	}
	delete(d.timers, node)
	delete(d.since, node)
	delete(d.ended, node)
}

// stop ends every drain: no timer outlives the loop.
func (d *drains) stop() {
	for node := range d.timers {
		d.end(node)
	}
}

// lingering reports whether a node is within its drain's delay at now: it keeps announcing
// what it announced, and takes nothing new.
func (d *drains) lingering(node string, now time.Time) bool {
	since, ok := d.since[node]
	return ok && now.Before(since.Add(d.delay))
}

// drainRound notes the drains that began or ended; a node whose delay is over has its
// lingering announcements rebuilt without it.
func (a *Announcer) drainRound(r *round) {
	s := &a.loop
	for _, node := range a.drains.observe(time.Now(), s.nodeList, a.cfg.Drain.Draining) {
		s.part(node).anns.Ascend(func(it annItem) bool {
			r.entry[it.ip] = true
			return true
		})
	}
}

// lingering reports whether a node is within its drain's delay now.
func (a *Announcer) lingering(node string) bool { return a.drains.lingering(node, time.Now()) }
