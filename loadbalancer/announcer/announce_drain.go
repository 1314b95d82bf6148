package announcer

import (
	"time"

	"k8s.io/klog/v2"
)

// drainRound notes the drains that began or ended: a node that began draining gets a timer for
// the end of its delay (which re-plans it); one whose delay is over has its lingering
// announcements rebuilt without it.
func (a *Announcer) drainRound(r *round) {
	s := &a.loop
	now := time.Now()
	for _, n := range s.nodeList {
		draining := a.cfg.Drain.Draining(n)
		since, known := s.drainSince[n.Name]
		switch {
		case draining && !known:
			s.drainSince[n.Name] = now
			klog.InfoS("Node is being drained: it takes no new VIP, and withdraws what it announces after the delay", "node", n.Name, "delay", a.cfg.Drain.Delay)
			s.drainTimers[n.Name] = time.AfterFunc(a.cfg.Drain.Delay+10*time.Millisecond, func() {
				a.note(func(c *changes) { c.nodes = true })
			})
		case draining && !s.drainEnded[n.Name] && !now.Before(since.Add(a.cfg.Drain.Delay)):
			s.drainEnded[n.Name] = true
			klog.InfoS("Drain delay over: the node withdraws what it announced", "node", n.Name)
			s.part(n.Name).anns.Ascend(func(it annItem) bool {
				r.entry[it.ip] = true
				return true
			})
		case !draining && known:
			a.endDrain(n.Name)
		}
	}
	for name := range s.drainSince {
		if _, ok := s.byName[name]; !ok {
			a.endDrain(name)
		}
	}
}

func (a *Announcer) endDrain(node string) {
	s := &a.loop
	if t := s.drainTimers[node]; t != nil {
		t.Stop()
	}
	delete(s.drainTimers, node)
	delete(s.drainSince, node)
	delete(s.drainEnded, node)
}

// lingering reports whether a node is within its drain's delay: it keeps announcing what it
// announced, and takes nothing new.
func (a *Announcer) lingering(node string) bool {
	since, ok := a.loop.drainSince[node]
	return ok && time.Now().Before(since.Add(a.cfg.Drain.Delay))
}
