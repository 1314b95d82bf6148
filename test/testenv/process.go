package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Proc is a process a test started, with its output in a log file.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // path of the file holding stdout and stderr
	done chan struct{}
	err  error
}

// StartProc starts cmd, logging to a file in the test's temporary folder. When the test ends
// the process is stopped, and if the test failed the end of its log is printed.
func StartProc(t TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Name: name, Cmd: cmd, Log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.Log)
	if err != nil {
		t.Fatalf("create log for %s: %v", name, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := Start(cmd); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("last lines of %s's log (%s):\n%s", name, p.Log, p.Tail(40))
			if kept := keepLog(t, p); kept != "" {
				t.Logf("the whole log of %s kept in %s", name, kept)
			}
		}
	})
	return p
}

// KeepLogsEnv names a folder where the whole logs of a failed test's processes are copied
// (the test's temporary folder is removed when it ends; a soak's cause is often minutes before
// its failure).
const KeepLogsEnv = "METALVIP_KEEP_LOGS"

var kept atomic.Int64

// keepLog copies p's log into $METALVIP_KEEP_LOGS, if set, and returns the copy's path.
func keepLog(t TB, p *Proc) string {
	dir := os.Getenv(KeepLogsEnv)
	if dir == "" {
		return ""
	}
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	path := filepath.Join(dir, fmt.Sprintf("%s-%03d-%s.log", name, kept.Add(1), p.Name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return ""
	}
	return path
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; valid once Done is closed.
func (p *Proc) Err() error { <-p.done; return p.err }

// Stop sends SIGTERM, waits up to grace, then kills.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill kills the process at once (SIGKILL) and waits for it.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// Output returns the whole log.
func (p *Proc) Output() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
