// Package e2ecluster installs metalvip on real kubelets (test/kubecluster) as a user would, from
// install.yaml and from the chart, and checks on the wire what users rely on: nodes initialised
// by the CCM pod, agents Ready, VIPs answering HTTP from pods through kube-proxy, BGP next hops
// following pods, failover when a node dies hard or a metalvip pod is deleted, and a rolling
// update, a rollback to the previous version and an upgrade from it that no client notices.
//
// One cluster serves the whole package (it takes about a minute to come up); each test
// installs metalvip, runs the checks and uninstalls it.
package e2ecluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/metalvip/metalvip/test/kubecluster"
	"github.com/metalvip/metalvip/test/testenv"
)

var (
	mu      sync.Mutex
	shared  *kubecluster.Cluster
	root    *testenv.Main
	sysctls map[string]string
	// previous is the version the upgrade steps roll back to and upgrade from.
	previous kubecluster.Previous
)

func TestMain(m *testing.M) {
	testenv.LabLock("test/e2ecluster")
	sysctls = readSysctls()
	code := m.Run()
	mu.Lock()
	if root != nil {
		if code != 0 {
			root.Errorf("a test failed: the cluster's logs follow")
		}
		root.Close()
		if err := leftovers(shared); err != nil {
			fmt.Fprintf(os.Stderr, "kubecluster teardown left something behind: %v\n", err)
			code = 1
		}
	}
	mu.Unlock()
	os.Exit(code)
}

// cluster returns the package's cluster, bringing it up on first use.
func cluster(t *testing.T) *kubecluster.Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		return shared
	}
	images, err := kubecluster.Images()
	if err != nil {
		t.Fatal(err)
	}
	// The version the upgrade steps roll back to and come from, imported beside this tree's.
	prev, err := kubecluster.PreviousVersion()
	if err != nil {
		testenv.Skip(t, "%v", err)
	}
	previous = prev
	images = append(images, prev.Images...)
	if _, err := kubecluster.FindBinaries(); err != nil {
		testenv.Skip(t, "%v", err)
	}
	for _, img := range images {
		if _, err := os.Stat(img); err != nil {
			testenv.Skip(t, "%s missing: run make images cluster-images (make test-deps does)", img)
		}
	}
	root = testenv.NewMain("e2ecluster")
	shared = kubecluster.New(root, kubecluster.Options{Images: images})
	// The suite shares a 2-core machine with other packages' tests: stalls of up to a second
	// (seen in CI: every agent took over its neighbours' VIPs at once) are no deaths here. The
	// shipped profile's figures come from make bench, which runs alone.
	shared.Failover = &kubecluster.FailoverProfile{Interval: "100ms", Misses: 15}
	return shared
}

var watchedSysctls = []string{"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "vm.panic_on_oom"}

func readSysctls() map[string]string {
	out := map[string]string{}
	for _, k := range watchedSysctls {
		b, _ := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		out[k] = strings.TrimSpace(string(b))
	}
	return out
}

// leftovers reports what a torn-down cluster left: changed sysctls, cgroups, its folder, its
// lab's namespaces.
func leftovers(c *kubecluster.Cluster) error {
	var problems []string
	for k, v := range readSysctls() {
		if sysctls[k] != v {
			problems = append(problems, fmt.Sprintf("sysctl %s is %s, was %s", k, v, sysctls[k]))
		}
	}
	if c == nil {
		return nil
	}
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/mvk-" + c.Lab.ID + "-*"); len(cg) > 0 {
		problems = append(problems, fmt.Sprintf("cgroups %v", cg))
	}
	if _, err := os.Stat(c.Dir); err == nil {
		problems = append(problems, "folder "+c.Dir)
	}
	for _, ns := range c.Lab.Namespaces() {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			problems = append(problems, "namespace "+ns)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
