// Command metalvipctl is metalvip's command-line tool: it creates the TLS material of the
// CCM and the agents (certs), shows what metalvip does (status) and what one node's agent
// announces (agent), converts MetalLB's configuration (migrate metallb), and writes the
// control-plane VIP's files for kubeadm HA (controlplane).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/metalvip/metalvip/internal/version"
)

func main() {
	root := &cobra.Command{
		Use:           "metalvipctl",
		Short:         "metalvip's command-line tool",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String("metalvipctl"),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(certsCommand(), statusCommand(), agentCommand(), migrateCommand(), controlPlaneCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "metalvipctl: %v\n", err)
		os.Exit(1)
	}
}
