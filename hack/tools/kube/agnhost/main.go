// Command agnhost is the conformance run's stand-in for registry.k8s.io/e2e-test-images/agnhost:
// the subcommands Kubernetes' LoadBalancer specs run (netexec, serve-hostname, pause, from the
// same k8s.io/kubernetes release as e2e.test), and, by the name it is called with, the shell
// tools the specs run in its pods through kubectl exec: sh (a POSIX shell, mvdan.cc/sh), nc,
// curl, wget and seq, cut to the options the specs pass. Static, so the image needs no libc and
// no registry: `make conformance-images` packs it with those names linked to it.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/test/images/agnhost/netexec"
	"k8s.io/kubernetes/test/images/agnhost/pause"
	servehostname "k8s.io/kubernetes/test/images/agnhost/serve-hostname"
)

// tools are the names the image links to this binary, each run as the tool of that name.
var tools = map[string]func(args []string) int{
	"sh":   shell,
	"nc":   netcat,
	"curl": curl,
	"wget": wget,
	"seq":  seq,
}

func main() {
	if tool, ok := tools[filepath.Base(os.Args[0])]; ok {
		os.Exit(tool(os.Args[1:]))
	}
	root := &cobra.Command{Use: "agnhost", Version: "2.66.1"}
	root.AddCommand(netexec.CmdNetexec, servehostname.CmdServeHostname, pause.CmdPause)
	os.Exit(cli.Run(root))
}

// fail prints the tool's error as the tool would and returns its exit code.
func fail(tool string, code int, format string, a ...any) int {
	fmt.Fprintf(os.Stderr, tool+": "+format+"\n", a...)
	return code
}
