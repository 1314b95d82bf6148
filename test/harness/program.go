package harness

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/metalvip/metalvip/test/testenv"
)

var begin = time.Now()

// Step prints a line of a program's progress, after the seconds since it began.
func Step(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
}

// Program is the frame of a program that runs the harnesses outside `go test` (make demo,
// make bench): a testenv.Main called name whose cleanups run on Ctrl-C (or SIGTERM) before it
// exits with status 130; a second Ctrl-C leaves at once. When asRoot is not empty the program
// needs root: without it, it prints asRoot (what to run instead) and exits with status 2.
func Program(name, asRoot string) *testenv.Main {
	if asRoot != "" && os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, asRoot)
		os.Exit(2)
	}
	m := testenv.NewMain(name)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Println("\ninterrupted: tearing down (Ctrl-C again to leave at once; the labs' reapers remove what is left)")
		go func() {
			<-sig
			os.Exit(130)
		}()
		m.Close()
		os.Exit(130)
	}()
	return m
}
