package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/metalvip/metalvip/nodeagent/controlplane"
)

const (
	testKey1 = "W4Cb7PBXxJ5l3gMIKevoZUv8/t+0AMwmeRAKGu6yOnw="
	testKey2 = "GOsrAm2Md56x9qCv7SD8TD4Z1+DKvNc+D0TWD1LnOXc="
	testKey3 = "7aPEQociCtCMiWUee4Ol1xnTa5fgv9TJceUjmveZDRo="
)

func runCtl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := controlPlaneCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestControlPlaneFilesAreWhatTheAgentTakes(t *testing.T) {
	out := t.TempDir()
	msg, err := runCtl(t, "files", "--vip", "203.0.113.10", "--bootstrap", "cp1", "--out", out, "--interface", "eth0",
		"--node", "cp1,198.51.100.11,"+testKey1+",100", "--node", "cp2,198.51.100.12,"+testKey2, "--node", "cp3,198.51.100.13,"+testKey3,
		"--tls-dir", "/etc/metalvip/tls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "kubeadm init --control-plane-endpoint 203.0.113.10:6443") {
		t.Errorf("the steps printed do not name the endpoint:\n%s", msg)
	}
	for _, node := range []string{"cp1", "cp2", "cp3"} {
		s, err := controlplane.Load(filepath.Join(out, node, cpConfigName))
		if err != nil {
			t.Fatalf("%s: the agent refuses the file written for it: %v", node, err)
		}
		if s.Self.Name != node || s.Bootstrap != (node == "cp1") || !slices.Equal(s.Names(), []string{"cp1", "cp2", "cp3"}) || s.Members[0].Priority != 100 {
			t.Errorf("%s: file says node %s, bootstrap %v, ranking %v", node, s.Self.Name, s.Bootstrap, s.Names())
		}
		data, err := os.ReadFile(filepath.Join(out, node, cpManifest))
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict(data, &pod); err != nil {
			t.Fatalf("%s: the static pod does not parse as a Pod: %v\n%s", node, err, data)
		}
		c := pod.Spec.Containers[0]
		if !pod.Spec.HostNetwork || !slices.Contains(c.Args, "--control-plane-config=/etc/metalvip/controlplane.yaml") ||
			!slices.Contains(c.Args, "--tls-cert=/etc/metalvip/tls/"+node+".crt") || len(pod.Spec.Volumes) != 4 {
			t.Errorf("%s: static pod %+v", node, pod.Spec)
		}
	}
}

func TestControlPlaneFilesRefuseMistakesBeforeWritingAnything(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a key from another tool is refused", []string{"--vip", "203.0.113.10", "--node", "cp1,198.51.100.11,AAAA", "--node", "cp2,198.51.100.12," + testKey2}, "nodes[0].heartbeatKey"},
		{"a missing key in L2 mode is refused", []string{"--vip", "203.0.113.10", "--node", "cp1,198.51.100.11", "--node", "cp2,198.51.100.12," + testKey2}, "nodes[0].heartbeatKey: missing"},
		{"a bootstrap node that is not listed is refused", []string{"--vip", "203.0.113.10", "--bootstrap", "cp9", "--node", "cp1,198.51.100.11," + testKey1}, "--bootstrap \"cp9\""},
		{"a bad VIP is refused", []string{"--vip", "nope", "--node", "cp1,198.51.100.11," + testKey1}, "vip:"},
		{"BGP without routers is refused", []string{"--vip", "203.0.113.10", "--mode", "bgp", "--bgp-asn", "64497", "--node", "cp1,198.51.100.11"}, "bgp.peers: empty"},
		{"a node name with capitals is refused", []string{"--vip", "203.0.113.10", "--node", "CP1,198.51.100.11," + testKey1}, "not a node name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			_, err := runCtl(t, append([]string{"files", "--out", out}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one with %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(out); len(ents) > 0 {
				t.Errorf("%d files written despite the error", len(ents))
			}
		})
	}
}

func TestBGPControlPlaneFilesGiveEveryNodeTheRouters(t *testing.T) {
	out := t.TempDir()
	if _, err := runCtl(t, "files", "--vip", "203.0.113.10", "--mode", "BGP", "--bgp-asn", "64497", "--bgp-peer", "198.51.100.1,64496",
		"--node", "cp1,198.51.100.11", "--node", "cp2,198.51.100.12", "--out", out); err != nil {
		t.Fatal(err)
	}
	s, err := controlplane.Load(filepath.Join(out, "cp2", cpConfigName))
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != controlplane.ModeBGP || len(s.Peers) != 1 || s.Peers[0].PeerASN != 64496 || s.Peers[0].LocalASN != 64497 || !s.Peers[0].BFD.Enabled {
		t.Errorf("BGP spec %+v", s)
	}
}

func TestStandbyTurnsOnAndOffInTheFile(t *testing.T) {
	out := t.TempDir()
	if _, err := runCtl(t, "files", "--vip", "203.0.113.10", "--node", "cp1,198.51.100.11,"+testKey1, "--out", out); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(out, "cp1", cpConfigName)
	for _, want := range []bool{true, false} {
		arg := map[bool]string{true: "on", false: "off"}[want]
		if _, err := runCtl(t, "standby", "--config", file, arg); err != nil {
			t.Fatal(err)
		}
		s, err := controlplane.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		if s.Standby != want {
			t.Errorf("after standby %s the file says standby %v", arg, s.Standby)
		}
	}
	if _, err := runCtl(t, "standby", "--config", file, "maybe"); err == nil {
		t.Error("standby maybe accepted")
	}
}
