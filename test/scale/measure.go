package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/harness/proc"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// ccm is the CCM process and its debug endpoint (--profiling, on its secure port).
type ccm struct {
	proc *testenv.Proc
	port int
	http *http.Client
}

func (c *ccm) pid() int { return c.proc.Cmd.Process.Pid }

// sample is what a process had used at one moment.
type sample struct {
	at       time.Time
	cpu      float64 // user+system seconds
	rss, hwm int64   // resident now, and its peak
}

func sampleOf(pid int) sample {
	mem, _ := proc.MemoryOf(pid)
	return sample{at: time.Now(), cpu: proc.CPUSeconds(pid), rss: mem.RSS, hwm: mem.HWM}
}

// apiCallsOf are the API server's requests so far, by "VERB resource[/subresource]" (its own
// apiserver_request_total).
func apiCallsOf(m *testenv.Main, srv *kubeapi.Server) figure.Counts {
	reqs, err := srv.Requests(context.Background())
	if err != nil {
		m.Fatalf("the API server's metrics: %v", err)
	}
	out := figure.Counts{}
	for _, r := range reqs {
		out[r.Verb+" "+r.Resource] += r.Count
	}
	return out
}

// writesOf counts the mutating calls.
func writesOf(a figure.Counts) float64 {
	t := 0.0
	for k, v := range a {
		switch verb, _, _ := strings.Cut(k, " "); verb {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
			t += v
		}
	}
	return t
}

// debug fetches a path of the CCM's debug endpoint.
func (c *ccm) debug(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.port, path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

func newDebugClient() *http.Client {
	// The CCM's serving certificate is its own self-signed one; nothing secret is sent.
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// profiler takes CPU profiles of the CCM back to back while a stage runs, so that the stage's
// whole profile is their sum. Each lasts every (one cut short by the stage's end is lost): a
// stage of a second or two needs profiles of a second.
type profiler struct {
	c      *ccm
	dir    string
	stage  string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	files  []string
	errs   []string
}

func (c *ccm) profile(dir, stage string, every time.Duration) *profiler {
	ctx, cancel := context.WithCancel(context.Background())
	p := &profiler{c: c, dir: dir, stage: stage, cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for i := 0; ctx.Err() == nil && i < 200; i++ {
			b, err := c.debug(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(every.Seconds())))
			if err != nil {
				if ctx.Err() == nil {
					p.mu.Lock()
					p.errs = append(p.errs, err.Error())
					p.mu.Unlock()
					time.Sleep(time.Second)
				}
				continue
			}
			name := filepath.Join(dir, fmt.Sprintf("ccm-%s-cpu-%03d.pprof", stage, i))
			if err := os.WriteFile(name, b, 0o644); err == nil {
				p.mu.Lock()
				p.files = append(p.files, name)
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// stop ends the profiling (the profile under way is cut short and dropped) and returns the
// top of the stage's CPU profile.
func (p *profiler) stop() string {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.files) == 0 {
		return "no profile: " + strings.Join(p.errs, "; ")
	}
	return pprofTop(append([]string{"-top", "-nodecount=25"}, p.files...)...)
}

// heap saves the CCM's heap profile and returns its top by memory in use.
func (c *ccm) heap(dir, stage string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := c.debug(ctx, "/debug/pprof/heap")
	if err != nil {
		return "no heap profile: " + err.Error()
	}
	name := filepath.Join(dir, "ccm-"+stage+"-heap.pprof")
	if err := os.WriteFile(name, b, 0o644); err != nil {
		return err.Error()
	}
	return pprofTop("-top", "-nodecount=15", "-sample_index=inuse_space", name)
}

func pprofTop(args ...string) string {
	cmd := exec.Command("go", append([]string{"tool", "pprof"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v: %s", err, out)
	}
	// Keep the table: the lines from the header on.
	s := string(out)
	if i := strings.Index(s, "      flat  flat%"); i >= 0 {
		head := s[:i]
		var keep []string
		for l := range strings.SplitSeq(head, "\n") {
			if strings.HasPrefix(l, "Duration:") || strings.HasPrefix(l, "Showing nodes") {
				keep = append(keep, l)
			}
		}
		s = strings.Join(keep, "\n") + "\n" + s[i:]
	}
	return strings.TrimRight(s, "\n")
}
