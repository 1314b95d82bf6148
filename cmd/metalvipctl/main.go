// Command metalvipctl is metalvip's command-line tool: it creates the TLS material of the
// CCM and the agents (certs), shows what metalvip does (status) and what one node's agent
// announces (agent), which versions run and whether they may run together (version), converts MetalLB's configuration (migrate metallb), and writes the
// control-plane VIP's files for kubeadm HA (controlplane). Named kubectl-metalvip on the PATH
// (make build links bin/kubectl-metalvip), it is kubectl's plugin: `kubectl metalvip status`.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/metalvip/metalvip/internal/version"
)

// pluginBinary is the name kubectl runs for `kubectl metalvip`.
const pluginBinary = "kubectl-metalvip"

func main() {
	root := rootCommand(filepath.Base(os.Args[0]))
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.DisplayName(), err)
		os.Exit(1)
	}
}

// rootCommand is metalvipctl's command tree as run under the name binary: as kubectl's plugin
// its help, examples of completion and errors say `kubectl metalvip`.
func rootCommand(binary string) *cobra.Command {
	root := &cobra.Command{
		Use:           "metalvipctl",
		Short:         "metalvip's command-line tool",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String("metalvipctl"),
	}
	if strings.TrimSuffix(binary, ".exe") == pluginBinary {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl metalvip"}
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(certsCommand(), statusCommand(), agentCommand(), migrateCommand(), controlPlaneCommand(), versionCommand(), sysdumpCommand())
	return root
}
