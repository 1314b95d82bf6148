package testenv

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// TB is the part of testing.TB the harnesses use. testing.T and testing.B satisfy it; so does
// Main, for programs (the demo) that run the harnesses outside `go test`.
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Failed() bool
	TempDir() string
	Name() string
}

var _ TB = testing.TB(nil)

// short reports -short, and false outside a test binary (where testing's flags do not exist).
func short() bool { return testing.Testing() && testing.Short() }

// Main is a TB for a program: Fatalf runs the cleanups and exits, cleanups run in reverse at
// Close.
type Main struct {
	name     string
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

// NewMain returns a TB for a program called name.
func NewMain(name string) *Main { return &Main{name: name} }

func (m *Main) Helper()                    {}
func (m *Main) Name() string               { return m.name }
func (m *Main) Logf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (m *Main) Skip(args ...any)           { m.Fatalf("%s", fmt.Sprint(args...)) }
func (m *Main) Failed() bool               { m.mu.Lock(); defer m.mu.Unlock(); return m.failed }
func (m *Main) Cleanup(f func())           { m.mu.Lock(); m.cleanups = append(m.cleanups, f); m.mu.Unlock() }
func (m *Main) Errorf(f string, args ...any) {
	m.mu.Lock()
	m.failed = true
	m.mu.Unlock()
	fmt.Fprintf(os.Stderr, "error: "+f+"\n", args...)
}

// Fatalf reports, cleans up and exits with status 1.
func (m *Main) Fatalf(f string, args ...any) {
	m.Errorf(f, args...)
	m.Close()
	os.Exit(1)
}

// TempDir returns a new temporary folder, removed at Close.
func (m *Main) TempDir() string {
	d, err := os.MkdirTemp("", m.name+"-")
	if err != nil {
		m.Fatalf("temp dir: %v", err)
	}
	m.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Close runs the cleanups, last registered first.
func (m *Main) Close() {
	m.mu.Lock()
	cs := m.cleanups
	m.cleanups = nil
	m.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
