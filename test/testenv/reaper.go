package testenv

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Reaper is a shell script that undoes what a harness made (namespaces, mounts, folders) when
// the test binary is done with it, however the binary ends: it waits for its stdin to close
// (the binary holds the other end; the kernel closes it at any exit, SIGKILL included), in a
// session of its own so that a terminal's Ctrl-C does not reach it.
type Reaper struct {
	cmd  *exec.Cmd
	pipe io.WriteCloser
}

// StartReaper starts `sh -c script name args...` with env added to the environment; script
// runs once stdin closes.
func StartReaper(name, script string, env []string, args ...string) (*Reaper, error) {
	cmd := exec.Command("/bin/sh", append([]string{"-c", "read -r _ || true\n" + script, name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pipe, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &Reaper{cmd: cmd, pipe: pipe}, nil
}

// Reap lets the script run now and waits for it, at most timeout; false when it did not finish.
func (r *Reaper) Reap(timeout time.Duration) bool {
	r.pipe.Close()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}
