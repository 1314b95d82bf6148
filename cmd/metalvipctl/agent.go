package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/metalvip/metalvip/internal/agentapi"
	"github.com/metalvip/metalvip/internal/certs"
	"github.com/metalvip/metalvip/internal/identity"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/provider/config"
)

func agentCommand() *cobra.Command {
	var (
		address, output string
		d               agentDialer
	)
	cmd := &cobra.Command{
		Use:   "agent NODE",
		Short: "Show what one node's agent announces, and each per-client VIP's share of clients",
		Long: `agent asks the agent of NODE what it announces now (its GetState): every VIP with its mode,
whether the node answers or advertises it and why, and for per-client L2 VIPs the nodes sharing
its clients and how many of the clients seen this node answers; then its BGP sessions, its
ARP/NDP counters and any problem.

` + agentDialHelp + ` The agent's address is the node's InternalIP, read from the cluster
(with kubectl's flags: --kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context), unless
--address gives it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: give table or json", output)
			}
			if err := d.check(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			var client kubernetes.Interface
			if address == "" || (!d.plaintext && !d.fromFiles(cmd)) {
				var err error
				if client, _, _, err = kubeClients(d.kube); err != nil {
					return fmt.Errorf("%w (or give --address and the --tls-* files)", err)
				}
			}
			addr, err := agentAddress(ctx, client, node, address)
			if err != nil {
				return err
			}
			creds, cleanup, err := d.credentials(ctx, cmd, client)
			if err != nil {
				return err
			}
			defer cleanup()
			st, err := d.state(ctx, creds, node, addr)
			if err != nil {
				return err
			}
			if output == "json" {
				b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(st)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return err
			}
			printAgent(cmd.OutOrStdout(), st)
			return nil
		},
	}
	d.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&address, "address", "", "the agent's IP address (default: the node's InternalIP)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// agentDialHelp says how metalvipctl reaches agents (agentDialer), for the commands' help.
const agentDialHelp = `The agent answers the viewer's identity (it may read the state, never change it) and the CCM's.
With enrolled agents (the ConfigMap metalvip-ca exists in --ca-namespace) metalvipctl asks the
CCM for a viewer's certificate of an hour, by a CertificateSigningRequest for the signer
metalvip.io/viewer: the kubeconfig's user needs the ClusterRole metalvip:viewer, never the CA's
key. Otherwise it reads the viewer's identity from its Secret (--tls-secret,
kube-system/metalvip-viewer-tls) through the kubeconfig, which takes the right to read that
Secret; or give the files "metalvipctl certs --out DIR" wrote with --tls-ca, --tls-cert and
--tls-key (viewer.crt and viewer.key by default; ccm.crt and ccm.key work too).`

// agentDialer is how metalvipctl reaches agents (agent, version): the cluster, the port and
// the viewer's identity, from its flags.
type agentDialer struct {
	kube                   *genericclioptions.ConfigFlags
	port                   int
	tlsFiles               certs.Files
	tlsSecret, caNamespace string
	plaintext              bool
}

func (d *agentDialer) addFlags(cmd *cobra.Command) {
	d.kube = kubeFlags(cmd)
	f := cmd.Flags()
	f.IntVar(&d.port, "port", config.DefaultAgentPort, "the agent's gRPC port")
	f.StringVar(&d.tlsSecret, "tls-secret", "kube-system/metalvip-viewer-tls", "NAMESPACE/NAME of the TLS Secret to read the client identity from (the viewer's by default; the CCM's, metalvip-ccm-tls, works too), through the kubeconfig, unless the --tls-* files are given")
	f.StringVar(&d.caNamespace, "ca-namespace", "kube-system", "where the enrolled agents' CA ConfigMap metalvip-ca is (agent.enroll.namespace): when it exists and no --tls-* flag is given, a viewer's certificate is asked of the CCM")
	f.StringVar(&d.tlsFiles.CA, "tls-ca", "ca.crt", "the CA certificate of metalvip's mutual TLS (instead of --tls-secret)")
	f.StringVar(&d.tlsFiles.Cert, "tls-cert", "viewer.crt", "the viewer's (or the CCM's) client certificate (instead of --tls-secret)")
	f.StringVar(&d.tlsFiles.Key, "tls-key", "viewer.key", "the viewer's (or the CCM's) client key (instead of --tls-secret)")
	f.BoolVar(&d.plaintext, "insecure", false, "talk plaintext, to an agent started with --insecure")
}

// check refuses flags that cannot work, before anything is asked.
func (d *agentDialer) check() error {
	if d.port < 1 || d.port > 65535 {
		return fmt.Errorf("--port %d: give a TCP port from 1 to 65535", d.port)
	}
	return nil
}

// fromFiles says whether the identity comes from the --tls-* files.
func (d *agentDialer) fromFiles(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("tls-ca") || cmd.Flags().Changed("tls-cert") || cmd.Flags().Changed("tls-key")
}

// credentials gets the viewer's identity once (client may be nil with --insecure or the files)
// and returns what makes each node's credentials; cleanup removes the files it wrote.
func (d *agentDialer) credentials(ctx context.Context, cmd *cobra.Command, client kubernetes.Interface) (creds func(node string) (credentials.TransportCredentials, error), cleanup func(), err error) {
	if d.plaintext {
		return func(string) (credentials.TransportCredentials, error) { return insecure.NewCredentials(), nil }, func() {}, nil
	}
	files, from, cleanup := d.tlsFiles, "--tls-ca, --tls-cert, --tls-key", func() {}
	if !d.fromFiles(cmd) {
		// Enrolled agents (the CA's ConfigMap exists): ask the CCM for a viewer's
		// certificate, unless a Secret is named. Else the viewer's Secret.
		from = "Secret " + d.tlsSecret
		ca, err := client.CoreV1().ConfigMaps(d.caNamespace).Get(ctx, identity.CAName, metav1.GetOptions{})
		if err == nil && !cmd.Flags().Changed("tls-secret") {
			from = "the viewer's certificate request"
			files, cleanup, err = viewerByCSR(ctx, client, []byte(ca.Data[identity.CAKey]))
		} else {
			files, cleanup, err = filesFromSecret(ctx, client, d.tlsSecret)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return func(node string) (credentials.TransportCredentials, error) {
		cfg, err := certs.ClientConfig(files, node)
		if err != nil {
			return nil, fmt.Errorf("TLS (%s): %w", from, err)
		}
		return credentials.NewTLS(cfg), nil
	}, cleanup, nil
}

// state asks node's agent at addr for its state.
func (d *agentDialer) state(ctx context.Context, creds func(string) (credentials.TransportCredentials, error), node string, addr netip.Addr) (*agentv1.GetStateResponse, error) {
	c, err := creds(node)
	if err != nil {
		return nil, err
	}
	at := netip.AddrPortFrom(addr, uint16(d.port))
	conn, err := grpc.NewClient("passthrough:///"+at.String(), append(agentapi.ClientOptions(), grpc.WithTransportCredentials(c))...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st, err := agentv1.NewAgentServiceClient(conn).GetState(ctx, &agentv1.GetStateRequest{})
	if err != nil {
		return nil, fmt.Errorf("agent of %s at %s: %w", node, at, err)
	}
	return st, nil
}

// agentAddress is the address given, else the node's InternalIP from the cluster.
func agentAddress(ctx context.Context, client kubernetes.Interface, node, given string) (netip.Addr, error) {
	if given != "" {
		a, err := netip.ParseAddr(given)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--address %q: not an IP address", given)
		}
		return a, nil
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("node %s (or give --address): %w", node, err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, errors.New("node " + node + " has no InternalIP; give --address")
}

// filesFromSecret writes a client TLS Secret (ca.crt, tls.crt, tls.key, as
// `metalvipctl certs --manifests` makes it) into a private temporary folder for
// certs.ClientConfig, the one place that builds the CCM's client TLS; cleanup removes it.
func filesFromSecret(ctx context.Context, client kubernetes.Interface, ref string) (certs.Files, func(), error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return certs.Files{}, nil, fmt.Errorf("--tls-secret %q: give NAMESPACE/NAME", ref)
	}
	sec, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return certs.Files{}, nil, fmt.Errorf("the TLS Secret %s: %w; give --tls-ca, --tls-cert and --tls-key (the files metalvipctl certs --out wrote) instead; with enrolled agents give no --tls-secret: a viewer's certificate is asked of the CCM (docs/agent-tls.md)", ref, err)
	}
	if isCA(sec.Data["tls.crt"]) {
		return certs.Files{}, nil, fmt.Errorf("the Secret %s holds the agents' CA: metalvipctl never uses the CA's key (whoever holds it can make the CCM's identity); without --tls-secret it asks the CCM for a viewer's certificate (the ClusterRole metalvip:viewer allows it; docs/agent-tls.md)", ref)
	}
	// In this order, every missing key named: the same Secret always gives the same error.
	var missing []string
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(sec.Data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return certs.Files{}, nil, fmt.Errorf("the Secret %s has no %s (metalvipctl certs --manifests makes ca.crt, tls.crt and tls.key)", ref, strings.Join(missing, " and "))
	}
	return privateFiles(sec.Data)
}

// isCA says whether certPEM is a CA's certificate.
func isCA(certPEM []byte) bool {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return false
	}
	c, err := x509.ParseCertificate(b.Bytes)
	return err == nil && c.IsCA
}

func printAgent(out io.Writer, st *agentv1.GetStateResponse) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	state := "applied"
	if st.GetRestored() {
		state = "restored from disk, no Apply since"
	}
	fmt.Fprintf(w, "Agent %s: term %d, generation %d, %s\n\n", st.GetNode(), st.GetTerm(), st.GetGeneration(), state)
	fmt.Fprintln(w, "VIP\tMODE\tACTIVE\tREASON\tCLIENTS")
	for _, v := range st.GetAnnounced() {
		mode := strings.TrimPrefix(v.GetMode().String(), "MODE_")
		clients := ""
		if len(v.GetSharing()) > 0 {
			mode += " per client"
			clients = fmt.Sprintf("answers %d of %d seen (shared by %s)", v.GetClientsAnswered(), v.GetClientsKnown(), strings.Join(v.GetSharing(), ", "))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.GetVip(), mode, yesNo(v.GetActive()), v.GetReason(), clients)
	}
	if len(st.GetPeers()) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "BGP PEER\tSTATE\tBFD\tSINCE\tLAST ERROR")
		for _, p := range st.GetPeers() {
			since := ""
			if p.GetSinceUnix() > 0 {
				since = time.Unix(p.GetSinceUnix(), 0).UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", agentapi.StatusKey(p), p.GetState(), p.GetBfdState(), since, p.GetLastError())
		}
	}
	if len(st.GetEgress()) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "EGRESS VIP\tEGRESS NODE\tTHIS NODE\tPODS HERE\tCONNECTIONS NATED")
		for _, e := range st.GetEgress() {
			part := "routes its pods to " + e.GetNode()
			if e.GetActive() {
				part = "source-NATs"
			}
			if e.GetProblem() != "" {
				part += " (" + e.GetProblem() + ")"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\n", e.GetVip(), e.GetNode(), part, e.GetSources(), e.GetFlows())
		}
	}
	if c := st.GetL2(); c != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "ARP: %s requests, %s replies, %s gratuitous; NDP: %s solicitations, %s advertisements, %s unsolicited; %s targeted replies to clients taken over\n",
			n(c.GetArpRequests()), n(c.GetArpReplies()), n(c.GetGratuitousArps()), n(c.GetNeighborSolicitations()), n(c.GetNeighborAdvertisements()), n(c.GetUnsolicitedAdvertisements()), n(c.GetTargetedReplies()))
	}
	if dp := st.GetDataPlane(); dp != nil {
		fmt.Fprintln(w)
		since := time.UnixMilli(dp.GetSinceUnixMillis()).UTC().Format(time.RFC3339)
		if dp.GetReady() {
			fmt.Fprintf(w, "kube-proxy: healthy (since %s)", since)
		} else {
			fmt.Fprintf(w, "kube-proxy: NOT healthy since %s, the node takes no VIP: %s", since, dp.GetDetail())
		}
		if len(dp.GetServingPorts())+len(dp.GetWaitingPorts()) > 0 {
			fmt.Fprintf(w, "; health check node ports serving %v, waiting %v", dp.GetServingPorts(), dp.GetWaitingPorts())
		}
		fmt.Fprintln(w)
	}
	for _, p := range st.GetProblems() {
		fmt.Fprintf(w, "Problem: %s\n", p)
	}
	w.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func n(v uint64) string { return strconv.FormatUint(v, 10) }
