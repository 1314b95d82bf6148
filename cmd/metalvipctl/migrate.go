package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/metalvip/metalvip/migrate/metallb"
	"github.com/metalvip/metalvip/provider/config"
)

func migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Convert another load balancer's configuration to metalvip's",
	}
	cmd.AddCommand(migrateMetalLBCommand())
	return cmd
}

func migrateMetalLBCommand() *cobra.Command {
	var passwordNamespace string
	var kube *genericclioptions.ConfigFlags
	var files []string
	cmd := &cobra.Command{
		Use:   "metallb",
		Short: "Print IPPools and BGPPeers made from MetalLB's configuration",
		Long: `metallb reads MetalLB's configuration (IPAddressPools, L2Advertisements, BGPAdvertisements,
BGPPeers, Communities and BFDProfiles in MetalLB's namespace, --namespace, default
metallb-system) from the cluster (with kubectl's flags: --kubeconfig, else $KUBECONFIG, else
~/.kube/config; --context) or from YAML files (-f), and prints the
IPPools and BGPPeers that do the same in metalvip, ready for kubectl apply. Each IPPool is named
as its MetalLB pool, so Services annotated metallb.io/address-pool keep finding it. A comment
starting CHECK: marks every place where metalvip will not do exactly what MetalLB did.
Nothing in the cluster is changed. See docs/migrating-from-metallb.md.`,
		Example: `  metalvipctl migrate metallb > metalvip-config.yaml
  metalvipctl migrate metallb -f metallb-config.yaml -f more/ > metalvip-config.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			namespace := namespaceFlag(cmd, kube)
			if namespace == "" {
				namespace = "metallb-system"
			}
			in := metallb.Config{Namespace: namespace}
			var skipped []string
			if len(files) > 0 {
				var err error
				if skipped, err = in.ReadFiles(files, cmd.InOrStdin()); err != nil {
					return err
				}
			} else {
				_, _, cfg, err := kubeClients(kube)
				if err != nil {
					return err
				}
				if skipped, err = in.ReadCluster(cmd.Context(), cfg); err != nil {
					return err
				}
			}
			for _, s := range skipped {
				fmt.Fprintf(cmd.ErrOrStderr(), "skipped %s\n", s)
			}
			conv := metallb.Convert(in, passwordNamespace)
			if err := metallb.Render(cmd.OutOrStdout(), conv); err != nil {
				return err
			}
			pools, peers := 0, 0
			for _, o := range conv.Objects {
				if o.Kind == "IPPool" {
					pools++
				} else {
					peers++
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "converted %d IPPools and %d BGPPeers from MetalLB's namespace %s; %d places to check (comments starting CHECK:)\n", pools, peers, namespace, conv.Checks())
			return nil
		},
	}
	kube = kubeFlags(cmd)
	// --namespace is MetalLB's: its configuration is read there only.
	cmd.Flags().Lookup("namespace").Usage = "MetalLB's namespace: its configuration is read there only (default metallb-system)"
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "read MetalLB's objects from this YAML file, folder (its .yaml, .yml and .json files) or - (standard input) instead of the cluster; repeatable")
	cmd.Flags().StringVar(&passwordNamespace, "password-namespace", config.DefaultPasswordNamespace, "the namespace the CCM reads BGP passwords from (cloud-config bgp.passwordSecretNamespace)")
	return cmd
}
