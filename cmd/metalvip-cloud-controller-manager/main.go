// Command metalvip-cloud-controller-manager is the Kubernetes cloud-controller-manager for
// bare metal: the framework's node, node-lifecycle and service controllers with the metalvip
// provider. Run kube-controller-manager and every kubelet with --cloud-provider=external.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version/verflag"
	"k8s.io/klog/v2"

	"github.com/metalvip/metalvip/internal/memlimit"
	"github.com/metalvip/metalvip/internal/version"
	"github.com/metalvip/metalvip/provider"
	providerconfig "github.com/metalvip/metalvip/provider/config"
)

func main() {
	cmd, err := newCommand()
	if err != nil {
		fmt.Fprintf(os.Stderr, "metalvip-cloud-controller-manager: %v\n", err)
		os.Exit(1)
	}
	os.Exit(cli.Run(cmd))
}

// Defaults that differ from the framework's. The framework's client defaults (20 QPS, burst
// 30, one service sync at a time) cap a controller far below what allocating for thousands of
// Services at once needs: each new Service costs three API writes (the status with the
// finalizer and record, the IPAllocated Event, the Announced condition). Measured with 1,000
// Services created at once (docs/benchmarks.md): at 200 QPS the client limit made the
// per-Service p99 4 s, at 500 QPS it is under 40 ms and the API server is the limit. Eight syncs (metalvip's own Service
// controller reads --concurrent-service-syncs) keep the API server busy; more gain little on 2
// cores. The flags still override these; the API server's priority and fairness protect it.
const (
	defaultKubeAPIQPS             = 500
	defaultKubeAPIBurst           = 1000
	defaultConcurrentServiceSyncs = 8
)

func newCommand() (*cobra.Command, error) {
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("initialise options: %w", err)
	}
	opts.KubeCloudShared.CloudProvider.Name = provider.ProviderName
	opts.Generic.ClientConnection.QPS = defaultKubeAPIQPS
	opts.Generic.ClientConnection.Burst = defaultKubeAPIBurst
	opts.ServiceController.ConcurrentServiceSyncs = defaultConcurrentServiceSyncs
	opts.Generic.LeaderElection.ResourceName = "metalvip-cloud-controller-manager"
	// Start while the API server is unreachable (a node cut off, a control plane restarting)
	// and wait for it in leader election, instead of exiting at once because the
	// front-proxy CA (extension-apiserver-authentication) could not be read: a pod that exits
	// goes into CrashLoopBackOff and comes back minutes after the API server does. Without it,
	// only front-proxy (request-header) authentication stays off for the process's life;
	// tokens are still checked by TokenReview and client certificates by the cluster's CA,
	// which is read again as soon as it can be.
	opts.Authentication.TolerateInClusterLookupFailure = true

	cmd := app.NewCloudControllerManagerCommand(opts, cloudInitializer, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	cmd.Use = "metalvip-cloud-controller-manager"
	cmd.Long = `metalvip-cloud-controller-manager gives Services of type LoadBalancer virtual IPs on bare
metal and initialises nodes (providerID metalvip://<node-name>, addresses, zone and region).
Settings of its own are in the --cloud-config file, documented in docs/cloud-config.md.`

	// Read the cloud-config before the framework builds clients and opens ports, so a mistake
	// in it is reported first and alone.
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		// --version prints metalvip's build; --version=raw keeps the framework's Kubernetes
		// version details.
		if f := c.Flags().Lookup("version"); f != nil && f.Value.String() == "true" {
			fmt.Fprintln(c.OutOrStdout(), version.String(cmd.Use))
			return nil
		}
		verflag.PrintAndExitIfRequested()
		klog.InfoS("Starting", "binary", cmd.Use, "version", version.Get().Version, "commit", version.Get().Commit)
		memlimit.SetAndLog()
		cp := opts.KubeCloudShared.CloudProvider
		if cp.Name != provider.ProviderName {
			return fmt.Errorf("--cloud-provider=%q: this binary runs only the %q provider; leave the flag out or set it to %q", cp.Name, provider.ProviderName, provider.ProviderName)
		}
		if _, err := readConfig(cp.CloudConfigFile); err != nil {
			// Plain text, not a log line: this is the operator's file and the message is the fix.
			fmt.Fprintf(os.Stderr, "metalvip-cloud-controller-manager: %v\n", err)
			os.Exit(1)
		}
		return run(c, args)
	}
	return cmd, nil
}

func readConfig(file string) (*providerconfig.Config, error) {
	cfg, err := provider.ReadConfig(file)
	if err != nil && file != "" {
		return nil, fmt.Errorf("--cloud-config %s: %w", file, err)
	}
	return cfg, err
}

// cloudInitializer is called by the framework after it has parsed its flags. The file was
// already checked in RunE, so an error here means it changed in between.
func cloudInitializer(c *config.CompletedConfig) cloudprovider.Interface {
	cp := c.ComponentConfig.KubeCloudShared.CloudProvider
	cfg, err := readConfig(cp.CloudConfigFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "metalvip-cloud-controller-manager: %v\n", err)
		os.Exit(1)
	}
	le := c.ComponentConfig.Generic.LeaderElection
	return provider.New(cfg, provider.Options{
		LeaderElection: provider.LeaderElection{Enabled: le.LeaderElect, Namespace: le.ResourceNamespace, Name: le.ResourceName},
		ServiceWorkers: int(c.ComponentConfig.ServiceController.ConcurrentServiceSyncs),
		StartedUp:      releaseStartupPages,
	})
}
