// Package testenv holds what every metalvip test harness shares: the rule for skipping when a
// test's prerequisites are missing, the repository's root, a process starter whose children
// die with the test binary, and a free port.
package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
)

// RequireEnv names the variable that turns every would-be skip into a failure. CI sets it, so a
// missing prerequisite can never pass as a skipped test.
const RequireEnv = "METALVIP_REQUIRE_LAB"

// Required reports whether skipping is forbidden.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Skip skips t with the reason, or fails it when METALVIP_REQUIRE_LAB=1.
func Skip(t TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s (%s=1 forbids skipping)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// RequireRoot skips (or fails, see Skip) a test that needs root.
func RequireRoot(t TB) {
	t.Helper()
	if short() {
		t.Skip("needs root and network namespaces; not run with -short")
	}
	if os.Geteuid() != 0 {
		Skip(t, "needs root for network namespaces; run `sudo make test`")
	}
}

// RepoRoot returns the repository's top folder: the nearest parent holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Start starts cmd so that it is killed when the test binary dies, however it dies. Linux sends
// the parent-death signal when the thread that forked the child exits, not the process, so all
// children are forked from one goroutine locked to a thread that lives as long as the process.
func Start(cmd *exec.Cmd) error {
	spawnerOnce.Do(func() { go spawner() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawn <- spawnRequest{cmd, done}
	return <-done
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan<- error
}

var (
	spawnerOnce sync.Once
	spawn       = make(chan spawnRequest)
)

func spawner() {
	runtime.LockOSThread() // never unlocked: this thread must not exit before the process
	for r := range spawn {
		r.done <- r.cmd.Start()
	}
}

// GoBuild builds the main package pkg (such as "./cmd/metalvip-agent", relative to the
// repository's root) into dir and returns the binary's path.
func GoBuild(dir, pkg string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// FreePort is a loopback TCP port free now, or fails t.
func FreePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// BuildMain builds the main packages pkgs (as GoBuild) into a new temporary folder for a test
// binary's TestMain and returns their paths, in order, and what removes them once the tests
// have run. It exits with the build's output when one does not build.
func BuildMain(name string, pkgs ...string) (bins []string, cleanup func()) {
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, pkg := range pkgs {
		bin, err := GoBuild(dir, pkg)
		if err != nil {
			os.RemoveAll(dir)
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		bins = append(bins, bin)
	}
	return bins, func() { os.RemoveAll(dir) }
}

// Lazy returns what runs build once, on the first call, and then gives its result to every
// caller, failing the test that asks when it failed: for what only some tests of a binary
// need (a TestMain's BuildMain builds for every test).
func Lazy[T any](build func() (T, error)) func(TB) T {
	once := sync.OnceValues(build)
	return func(t TB) T {
		t.Helper()
		v, err := once()
		if err != nil {
			t.Fatalf("%v", err)
		}
		return v
	}
}
