package main

import (
	"strings"
	"testing"
)

func TestStandaloneFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for accepted
	}{
		{"the control-plane file alone needs no node name and no TLS", []string{"--control-plane-config", "/etc/metalvip/controlplane.yaml"}, ""},
		{"the control-plane file with TLS also serves the CCM", []string{"--control-plane-config", "f", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"}, ""},
		{"half the TLS flags are refused", []string{"--control-plane-config", "f", "--tls-ca", "a"}, "--tls-ca, --tls-cert and --tls-key are required"},
		{"printing the key needs nothing else", []string{"--print-heartbeat-key", "--state-dir", "/tmp/x"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v; want one with %q", err, tc.want)
			}
		})
	}
}
