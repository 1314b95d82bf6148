package l2

import (
	"testing"
	"time"
)

// The client table sits on the receive path of every ARP request and neighbour solicitation
// for a per-client VIP: these measure what one sighting costs with the default limits, on a
// clock that moves a microsecond a sighting (a million a second).

// A client the table knows, asking again: the common case.
func BenchmarkSeeAKnownClient(b *testing.B) {
	tb, clock := table(ClientLimits{})
	tb.see(seen(1))
	b.ReportAllocs()
	for b.Loop() {
		clock.Add(time.Microsecond)
		tb.see(seen(1))
	}
}

// A flood of forged senders, each new: the admission budget turns nearly all of them away.
func BenchmarkSeeAFloodOfNewSenders(b *testing.B) {
	c := newFakeClock()
	tb := newClientTable(ClientLimits{}, c.Now)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Add(time.Microsecond)
		tb.see(seen(i))
		i++
	}
}
