package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/nodeagent/controlplane"
)

// Where the files go on a control-plane node.
const (
	cpConfigDir  = "/etc/metalvip"
	cpConfigName = "controlplane.yaml"
	cpManifest   = "metalvip-controlplane.yaml" // in kubelet's /etc/kubernetes/manifests
	cpStateDir   = "/var/lib/metalvip-agent"
)

func controlPlaneCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "controlplane",
		Short: "The control-plane VIP for kubeadm HA: files for each control-plane node, standby",
		Long: `controlplane writes what metalvip-agent needs to serve kubeadm's --control-plane-endpoint
on each control-plane node: the local file (` + cpConfigDir + `/` + cpConfigName + `) and a static pod
manifest for kubelet (/etc/kubernetes/manifests/` + cpManifest + `). See docs/control-plane.md for
the steps, in order: collect each node's heartbeat key, write the files, kubeadm init, kubeadm join.`,
	}
	cmd.AddCommand(controlPlaneFilesCommand(), controlPlaneStandbyCommand())
	return cmd
}

// cpFilesOptions are the flags of `controlplane files`.
type cpFilesOptions struct {
	vip, mode, bootstrap, image, out string
	nodes, interfaces, bgpPeers      []string
	bgpASN                           uint32
	bfd                              bool
	tlsDir                           string
	interval                         string
}

func controlPlaneFilesCommand() *cobra.Command {
	o := &cpFilesOptions{}
	cmd := &cobra.Command{
		Use:   "files --vip ADDR --node NAME,ADDRESS,KEY[,PRIORITY] ... --out DIR",
		Short: "Write each control-plane node's local file and static pod manifest",
		Long: `files writes DIR/NODE/` + cpConfigName + ` and DIR/NODE/` + cpManifest + ` for every --node: the same
node list for all (each node's copy names itself), the bootstrap setting only on the node given to
--bootstrap (the one that runs kubeadm init). KEY is what ` + "`metalvip-agent --print-heartbeat-key`" + `
printed on that node. Every file is checked with the agent's own rules before anything is written.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return writeControlPlaneFiles(cmd.OutOrStdout(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.vip, "vip", "", "the control-plane endpoint's address (kubeadm init --control-plane-endpoint VIP:6443)")
	f.StringArrayVar(&o.nodes, "node", nil, "a control-plane node: NAME,ADDRESS,KEY[,PRIORITY] (repeat for each; higher priority holds the VIP first)")
	f.StringVar(&o.mode, "mode", string(controlplane.ModeL2), "L2 (ARP/NDP, one node at a time) or BGP (every ready node, anycast)")
	f.StringVar(&o.bootstrap, "bootstrap", "", "the node that runs kubeadm init: it brings the VIP up before its API server exists")
	f.StringArrayVar(&o.interfaces, "interface", nil, "interface to answer ARP/NDP on (L2; default: the agent's default-route interface)")
	f.Uint32Var(&o.bgpASN, "bgp-asn", 0, "BGP: the nodes' ASN")
	f.StringArrayVar(&o.bgpPeers, "bgp-peer", nil, "BGP: a router, ADDRESS,ASN (repeat for each)")
	f.BoolVar(&o.bfd, "bfd", true, "BGP: BFD with the routers")
	f.StringVar(&o.interval, "heartbeat-interval", "", "L2: heartbeat interval (default 50ms; failover takes 3 of them)")
	f.StringVar(&o.image, "image", "ghcr.io/metalvip/metalvip-agent:v0.1.0", "the agent's image for the static pod (make images tags it so; make release prints it by digest)")
	f.StringVar(&o.tlsDir, "tls-dir", "", "the host folder of the agent's TLS files (ca.crt, NODE.crt, NODE.key from `metalvipctl certs`): the same agent then also serves the CCM's Service VIPs")
	f.StringVar(&o.out, "out", "", "folder to write one sub-folder per node into")
	return cmd
}

func parseCPNode(s string) (controlplane.Node, error) {
	parts := strings.Split(s, ",")
	if len(parts) < 2 || len(parts) > 4 {
		return controlplane.Node{}, fmt.Errorf("--node %q: give NAME,ADDRESS,KEY[,PRIORITY]", s)
	}
	n := controlplane.Node{Name: parts[0], Address: parts[1]}
	if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
		return n, fmt.Errorf("--node %q: %q is not a node name: %s", s, n.Name, strings.Join(errs, "; "))
	}
	if len(parts) > 2 {
		n.HeartbeatKey = parts[2]
	}
	if len(parts) > 3 {
		p, err := strconv.ParseInt(parts[3], 10, 32)
		if err != nil {
			return n, fmt.Errorf("--node %q: priority %q is not a number", s, parts[3])
		}
		n.Priority = int32(p)
	}
	return n, nil
}

func writeControlPlaneFiles(w io.Writer, o *cpFilesOptions) error {
	if o.out == "" {
		return errors.New("--out is required: the folder to write the files into")
	}
	if len(o.nodes) == 0 {
		return errors.New("--node is required: every control-plane node, NAME,ADDRESS,KEY")
	}
	var nodes []controlplane.Node
	for _, s := range o.nodes {
		n, err := parseCPNode(s)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	if o.bootstrap != "" && !containsNode(nodes, o.bootstrap) {
		return fmt.Errorf("--bootstrap %q is not one of the --node names", o.bootstrap)
	}
	base := controlplane.Config{
		APIVersion: controlplane.APIVersion, Kind: controlplane.Kind,
		VIP: o.vip, Mode: controlplane.Mode(strings.ToUpper(o.mode)), Interfaces: o.interfaces, Nodes: nodes,
	}
	if o.interval != "" {
		d, err := time.ParseDuration(o.interval)
		if err != nil {
			return fmt.Errorf("--heartbeat-interval: %w", err)
		}
		base.Heartbeat.Interval = metav1.Duration{Duration: d}
	}
	if base.Mode == controlplane.ModeBGP || o.bgpASN != 0 || len(o.bgpPeers) > 0 {
		b := &controlplane.BGP{ASN: o.bgpASN}
		for _, p := range o.bgpPeers {
			addr, asn, ok := strings.Cut(p, ",")
			n, err := strconv.ParseUint(asn, 10, 32)
			if !ok || err != nil {
				return fmt.Errorf("--bgp-peer %q: give ADDRESS,ASN", p)
			}
			peer := controlplane.BGPPeer{Address: addr, PeerASN: uint32(n)}
			if o.bfd {
				peer.BFD = &controlplane.BFD{}
			}
			b.Peers = append(b.Peers, peer)
		}
		base.BGP = b
	}
	// Check every node's file before writing any.
	files, pods := map[string][]byte{}, map[string][]byte{}
	for _, n := range nodes {
		c := base
		c.Node, c.Bootstrap = n.Name, n.Name == o.bootstrap
		if _, err := c.Check(); err != nil {
			return fmt.Errorf("the file for %s: %w", n.Name, err)
		}
		data, err := controlplane.Encode(&c)
		if err != nil {
			return err
		}
		files[n.Name] = data
		if pods[n.Name], err = staticPod(o, n.Name); err != nil {
			return fmt.Errorf("the static pod for %s: %w", n.Name, err)
		}
	}
	for _, n := range nodes {
		dir := filepath.Join(o.out, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, cpConfigName), files[n.Name], 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, cpManifest), pods[n.Name], 0o644); err != nil {
			return err
		}
	}
	endpoint := netip.MustParseAddr(o.vip)
	fmt.Fprintf(w, "Wrote %s/NODE/{%s,%s} for %d nodes.\n", o.out, cpConfigName, cpManifest, len(nodes))
	fmt.Fprintf(w, "On each node: copy %s to %s/ and %s to /etc/kubernetes/manifests/.\n", cpConfigName, cpConfigDir, cpManifest)
	if o.bootstrap != "" {
		fmt.Fprintf(w, "Then on %s: kubeadm init --control-plane-endpoint %s --upload-certs\n", o.bootstrap, netip.AddrPortFrom(endpoint, controlplane.DefaultAPIServerPort))
	}
	fmt.Fprintf(w, "Then on each other node: kubeadm join %s --control-plane ... (as kubeadm init printed)\n", netip.AddrPortFrom(endpoint, controlplane.DefaultAPIServerPort))
	return nil
}

func containsNode(nodes []controlplane.Node, name string) bool {
	for _, n := range nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// staticPodManifest is what is written of the static pod: a Pod without status.
type staticPodManifest struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            corev1.PodSpec    `json:"spec"`
}

// staticPod is the agent's static pod for kubelet: the host's network, the capabilities of
// the DaemonSet's agent, the local file's folder (a folder, not the file: a file replaced by
// rename, as standby writes it, shows through a folder mount only), the state folder (keys,
// bootstrap record) and the cluster CA (to check the API server), and no Kubernetes
// credentials.
func staticPod(o *cpFilesOptions, node string) ([]byte, error) {
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}}
	}
	agent := corev1.Container{
		Name:  "agent",
		Image: o.image,
		Args: []string{
			"--control-plane-config=" + cpConfigDir + "/" + cpConfigName,
			"--state-dir=" + cpStateDir,
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("40Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			Privileged:               new(false),
			AllowPrivilegeEscalation: new(false),
			ReadOnlyRootFilesystem:   new(true),
			RunAsUser:                new(int64(0)),
			Capabilities: &corev1.Capabilities{
				Drop: []corev1.Capability{"ALL"},
				Add:  []corev1.Capability{"NET_RAW", "NET_ADMIN", "NET_BIND_SERVICE"},
			},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "config", MountPath: cpConfigDir, ReadOnly: true},
			{Name: "state", MountPath: cpStateDir},
			{Name: "pki", MountPath: "/etc/kubernetes/pki", ReadOnly: true},
		},
	}
	volumes := []corev1.Volume{
		hostPath("config", cpConfigDir, corev1.HostPathDirectory),
		hostPath("state", cpStateDir, corev1.HostPathDirectoryOrCreate),
		hostPath("pki", "/etc/kubernetes/pki", corev1.HostPathDirectoryOrCreate),
	}
	if o.tlsDir != "" {
		agent.Args = append(agent.Args, "--listen-address=:7472", "--tls-ca=/etc/metalvip/tls/ca.crt",
			"--tls-cert=/etc/metalvip/tls/"+node+".crt", "--tls-key=/etc/metalvip/tls/"+node+".key")
		agent.VolumeMounts = append(agent.VolumeMounts, corev1.VolumeMount{Name: "tls", MountPath: "/etc/metalvip/tls", ReadOnly: true})
		volumes = append(volumes, hostPath("tls", o.tlsDir, corev1.HostPathDirectory))
	}
	data, err := yaml.Marshal(staticPodManifest{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		Metadata: metav1.ObjectMeta{
			Name:      "metalvip-controlplane",
			Namespace: "kube-system",
			Labels:    map[string]string{"app.kubernetes.io/name": "metalvip-controlplane", "app.kubernetes.io/part-of": "metalvip"},
		},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			PriorityClassName:             "system-node-critical",
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(10)),
			Containers:                    []corev1.Container{agent},
			Volumes:                       volumes,
		},
	})
	if err != nil {
		return nil, err
	}
	head := "# metalvip-agent serving the control-plane VIP (kubeadm's --control-plane-endpoint) on " + node + ".\n" +
		"# A static pod: kubelet runs it from /etc/kubernetes/manifests before any API server exists.\n" +
		"# Written by metalvipctl controlplane files; see docs/control-plane.md.\n"
	return append([]byte(head), data...), nil
}

func controlPlaneStandbyCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "standby on|off",
		Short: "Keep this node from holding the control-plane VIP (before an upgrade), or let it again",
		Long: `standby sets standby in the node's local file; the agent reads it within a second. With standby
on the node still counts for the majority but never holds the VIP: it moves, in order, to the
next ready node, while this node's API server still answers. Turn it off after the upgrade.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			on := args[0] == "on"
			if !on && args[0] != "off" {
				return fmt.Errorf("%q: give on or off", args[0])
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			c, err := controlplane.Decode(data)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			c.Standby = on
			if _, err := c.Check(); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			out, err := controlplane.Encode(c)
			if err != nil {
				return err
			}
			tmp := file + ".tmp"
			if err := os.WriteFile(tmp, out, 0o644); err != nil {
				return err
			}
			if err := os.Rename(tmp, file); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: standby %s; the agent reads it within a second\n", c.Node, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "config", cpConfigDir+"/"+cpConfigName, "the node's local file")
	return cmd
}
