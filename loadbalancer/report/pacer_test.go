package report

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// allocateFor calls Allocating every 5 ms until d has passed, as a create burst does.
func allocateFor(p *Pacer, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		p.Allocating()
	}
}

func TestPacer(t *testing.T) {
	t.Run("with no allocation written, reports go at once", func(t *testing.T) {
		p := NewPacer(200*time.Millisecond, 10)
		start := time.Now()
		for range 100 {
			if err := p.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("100 reports with no allocation took %s; they should not wait", d)
		}
	})
	t.Run("while allocations are written, reports go at the rate and are never starved", func(t *testing.T) {
		p := NewPacer(200*time.Millisecond, 20)
		p.Allocating()
		done := make(chan struct{})
		go func() { defer close(done); allocateFor(p, 1500*time.Millisecond) }()
		var through atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for p.Wait(ctx) == nil {
			through.Add(1)
		}
		<-done
		// 1 s at 20 a second: the first goes at once, then one each 50 ms.
		if n := through.Load(); n < 5 || n > 22 {
			t.Errorf("%d reports went through in 1 s of allocations at 20 a second", n)
		}
		t.Logf("%d reports in 1 s of allocations", through.Load())
	})
	t.Run("once allocations stop, waiting reports go within the quiet time", func(t *testing.T) {
		p := NewPacer(200*time.Millisecond, 0.1) // one report each 10 s while busy
		p.Allocating()
		if err := p.Wait(context.Background()); err != nil { // the one allowed while busy
			t.Fatal(err)
		}
		go allocateFor(p, 300*time.Millisecond)
		start := time.Now()
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		if d < 300*time.Millisecond || d > 2*time.Second {
			t.Errorf("a report waited %s behind 300 ms of allocations and a quiet time of 200 ms", d)
		}
		t.Logf("waited %s", d)
	})
	t.Run("an ended context ends the wait", func(t *testing.T) {
		p := NewPacer(time.Hour, 0.001)
		p.Allocating()
		_ = p.Wait(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait returned %v, want the context's deadline", err)
		}
	})
	t.Run("a nil pacer never waits", func(t *testing.T) {
		var p *Pacer
		p.Allocating()
		if err := p.Wait(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

func TestAPacedWriteSetAgainWhileWaitingIsMadeOnceTheLatest(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := NewPacer(300*time.Millisecond, 0.1)
	p.Allocating()
	_ = p.Wait(context.Background()) // the next one waits until 300 ms after the last allocation
	w := NewWriter("test-paced", p)
	var mu sync.Mutex
	var made []string
	write := func(v string) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			made = append(made, v)
			mu.Unlock()
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); w.Run(ctx, 1) }()
	w.SetPaced("svc/a", write("first"))
	time.Sleep(50 * time.Millisecond) // the worker holds the key, waiting
	w.SetPaced("svc/a", write("second"))
	w.Set("pool/p", write("unpaced"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(made)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a second write of svc/a would come now
	cancel()
	<-ran
	mu.Lock()
	defer mu.Unlock()
	// The unpaced write does not wait behind the paced one.
	if len(made) != 2 || made[0] != "unpaced" || made[1] != "second" {
		t.Errorf("writes made %q, want the unpaced one at once, then the latest paced write once", made)
	}
}

func TestAKeysPartsAreMadeTogetherAndAFailedOneAloneAgain(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := NewWriter("test-parts", nil)
	var mu sync.Mutex
	made := map[string]int{}
	fails := 1 // the record's first write fails
	write := func(v string) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if v == "record" && fails > 0 {
				fails--
				return errors.New("refused")
			}
			made[v]++
			return nil
		}
	}
	w.SetPacedPart("svc/a", PartStatus, write("condition"))
	w.SetPacedPart("svc/a", PartRecord, write("old record"))
	w.SetPacedPart("svc/a", PartRecord, write("record")) // the latest of a part replaces the one set before
	if n := w.paced.Len(); n != 1 {
		t.Errorf("the queue holds %d items for one key's two parts, want 1", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); w.Run(ctx, 1) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		done := made["record"] == 1
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a second write of either would come now
	cancel()
	<-ran
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"condition": 1, "record": 1}
	if len(made) != len(want) || made["condition"] != 1 || made["record"] != 1 {
		t.Errorf("writes made %v, want %v: each part's latest once, the failed one again alone", made, want)
	}
}
