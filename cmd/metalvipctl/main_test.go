package main

import (
	"bytes"
	"strings"
	"testing"
)

// runAs runs metalvipctl's command tree under the name binary and returns what it printed.
func runAs(t *testing.T, binary string, args ...string) string {
	t.Helper()
	root := rootCommand(binary)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		t.Fatalf("%s %v: %v\n%s", binary, args, err, out.String())
	}
	return out.String()
}

func TestAsKubectlsPluginItsHelpSaysKubectlMetalvip(t *testing.T) {
	for _, tc := range []struct{ binary, want, not string }{
		{"metalvipctl", "metalvipctl status", "kubectl metalvip"},
		{"kubectl-metalvip", "kubectl metalvip status", "metalvipctl status"},
		{"kubectl-metalvip.exe", "kubectl metalvip status", "metalvipctl status"},
	} {
		out := runAs(t, tc.binary, "status", "--help")
		if !strings.Contains(out, tc.want) || strings.Contains(out, tc.not) {
			t.Errorf("%s status --help: want %q and no %q in:\n%s", tc.binary, tc.want, tc.not, out)
		}
	}
}

func TestCompletionScriptsAreMadeForEveryShell(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if out := runAs(t, "metalvipctl", "completion", shell); !strings.Contains(out, "metalvipctl") || len(out) < 500 {
			t.Errorf("completion %s: %d bytes, naming metalvipctl: %v", shell, len(out), strings.Contains(out, "metalvipctl"))
		}
	}
	// What a shell asks when completing: the subcommands, from the program itself.
	out := runAs(t, "metalvipctl", "__complete", "st")
	if !strings.Contains(out, "status") {
		t.Errorf("__complete st: no status in:\n%s", out)
	}
}
