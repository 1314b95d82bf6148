package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/metalvip/metalvip/internal/version"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

// versionReport is what `metalvipctl version` says: its own build, the CCM builds the agents
// hold a state from, every node's agent and whether each pair is within the supported skew
// (docs/upgrading.md: the CCM with agents one minor version older or newer).
type versionReport struct {
	Client   build          `json:"client"`
	CCM      []ccmBuild     `json:"ccm,omitempty"`
	Agents   []agentVersion `json:"agents,omitempty"`
	Warnings []string       `json:"warnings,omitempty"`
}

type build struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
}

// ccmBuild is a build of the CCM and how many agents hold a state it applied (two during the
// CCM's rolling update).
type ccmBuild struct {
	build
	Agents int `json:"agents"`
}

type agentVersion struct {
	Node      string `json:"node"`
	Version   string `json:"version,omitempty"`
	Commit    string `json:"commit,omitempty"`
	AppliedBy *build `json:"appliedBy,omitempty"`
	// Skew is "ok", "ok: ..." within the supported skew, "unsupported: ..." outside it, or
	// "unknown: ..." when it cannot be told.
	Skew  string `json:"skew"`
	Error string `json:"error,omitempty"`
}

// agentsAtOnce bounds the agents asked at the same time; agentWait bounds each.
const (
	agentsAtOnce = 16
	agentWait    = 5 * time.Second
)

func versionCommand() *cobra.Command {
	var (
		d          agentDialer
		out        *printFlags
		clientOnly bool
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the versions of metalvipctl, the CCM and every node's agent, and flag a version skew",
		Long: `version asks every node's agent (at its InternalIP) for its build and for the build of the CCM
whose state it holds, and says for each whether the two are within the supported skew: the CCM
with agents one minor version older or newer (docs/upgrading.md). During the CCM's rolling
update two CCM builds show. An agent that does not answer within 5 seconds is listed with why;
development builds ("(devel)") cannot be compared and show as unknown.

` + agentDialHelp + ` With --client, only metalvipctl's own version.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.check(); err != nil {
				return err
			}
			if err := d.check(); err != nil {
				return err
			}
			me := version.Get()
			rep := versionReport{Client: build{Version: me.Version, Commit: me.Commit}}
			if !clientOnly {
				ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
				defer cancel()
				client, _, _, err := kubeClients(d.kube)
				if err != nil {
					return err
				}
				if err := d.agentVersions(ctx, cmd, client, &rep, nil); err != nil {
					return err
				}
			}
			return out.print(cmd.OutOrStdout(), rep, func(w io.Writer, wide bool) { printVersions(w, rep, wide, clientOnly) })
		},
	}
	d.addFlags(cmd)
	out = addPrintFlags(cmd)
	cmd.Flags().BoolVar(&clientOnly, "client", false, "show metalvipctl's version only, asking nothing of the cluster")
	return cmd
}

// agentVersions asks every node's agent for its build and the CCM's, fills rep with them and
// judges each pair; keep, when given, gets every state that came, as JSON (sysdump).
func (d *agentDialer) agentVersions(ctx context.Context, cmd *cobra.Command, client kubernetes.Interface, rep *versionReport, keep func(node string, state []byte)) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the nodes: %w", err)
	}
	creds, cleanup, err := d.credentials(ctx, cmd, client)
	if err != nil {
		return err
	}
	defer cleanup()
	rep.Agents = d.eachAgent(ctx, creds, nodes.Items, keep)
	judgeSkew(rep)
	return nil
}

// agentVersion asks node's agent for its state and says its builds (the state is nil when the
// agent did not answer).
func (d *agentDialer) agentVersion(ctx context.Context, creds func(string) (credentials.TransportCredentials, error), node *corev1.Node) (agentVersion, *agentv1.GetStateResponse) {
	v := agentVersion{Node: node.Name}
	var addr netip.Addr
	for _, a := range node.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && !addr.IsValid() {
			addr = ip
		}
	}
	if !addr.IsValid() {
		v.Error = "the node has no InternalIP"
		return v, nil
	}
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	st, err := d.state(ctx, creds, node.Name, addr)
	if err != nil {
		v.Error = err.Error()
		return v, nil
	}
	// What the agent says is shown as text: printable and short, whatever it sends.
	v.Version, v.Commit = version.Printable(st.GetBuild().GetVersion()), version.Printable(st.GetBuild().GetCommit())
	if b := st.GetAppliedBy(); b != nil {
		v.AppliedBy = &build{Version: version.Printable(b.GetVersion()), Commit: version.Printable(b.GetCommit())}
	}
	return v, st
}

// judgeSkew says, for every agent that answered, whether it and the CCM whose state it holds
// are within the supported skew, counts the CCM builds and warns of what is not.
func judgeSkew(rep *versionReport) {
	ccms := map[build]int{}
	for i := range rep.Agents {
		a := &rep.Agents[i]
		switch {
		case a.Error != "":
			a.Skew = "unknown: no answer"
		case a.Version == "" && a.AppliedBy == nil:
			a.Skew = "unknown: the agent does not say its version (an older agent)"
		case a.AppliedBy == nil:
			a.Skew = "unknown: no state applied since the agent started (or its CCM does not say its version)"
		default:
			ccms[*a.AppliedBy]++
			a.Skew = version.Skew(a.AppliedBy.Version, a.Version)
		}
		if version.Unsupported(a.Skew) {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("the agent of %s (%s) and the CCM (%s): %s", a.Node, a.Version, a.AppliedBy.Version, a.Skew))
		}
		if a.Error != "" {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("the agent of %s did not answer: %s", a.Node, a.Error))
		}
	}
	for b, n := range ccms {
		rep.CCM = append(rep.CCM, ccmBuild{build: b, Agents: n})
		if s := version.Skew(b.Version, rep.Client.Version); version.Unsupported(s) {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("metalvipctl (%s) and the CCM (%s): %s; it may misread what this CCM writes", rep.Client.Version, b.Version, s))
		}
	}
	slices.SortFunc(rep.CCM, func(a, b ccmBuild) int { return strings.Compare(a.Version+a.Commit, b.Version+b.Commit) })
}

func printVersions(w io.Writer, rep versionReport, wide, clientOnly bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "metalvipctl\t%s\t(commit %s)\n", rep.Client.Version, rep.Client.Commit)
	if clientOnly {
		_ = tw.Flush()
		return
	}
	if len(rep.CCM) == 0 {
		fmt.Fprintf(tw, "CCM\tunknown\t(no agent holds a state it says it applied)\n")
	}
	for _, c := range rep.CCM {
		fmt.Fprintf(tw, "CCM\t%s\t(commit %s), the state of %d of %d agents\n", c.Version, c.Commit, c.Agents, len(rep.Agents))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "NODE\tAGENT\tCOMMIT\tCCM\tCCM COMMIT\tSKEW")
	} else {
		fmt.Fprintln(tw, "NODE\tAGENT\tCCM\tSKEW")
	}
	for _, a := range rep.Agents {
		ccm, ccmCommit := "-", "-"
		if a.AppliedBy != nil {
			ccm, ccmCommit = a.AppliedBy.Version, a.AppliedBy.Commit
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Node, orDash(a.Version), orDash(a.Commit), ccm, ccmCommit, a.Skew)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Node, orDash(a.Version), ccm, a.Skew)
		}
	}
	_ = tw.Flush()
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
