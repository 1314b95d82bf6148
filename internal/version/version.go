// Package version says which build of metalvip is running: its version and source commit,
// stamped by `-ldflags -X` (make and the image build pass the same flags, see the Makefile's
// LDFLAGS), else taken from what the Go toolchain recorded in the binary; and whether two
// builds may run together (Skew). It decides nothing else and must not import anything of
// metalvip's.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// Set by the linker: -X github.com/metalvip/metalvip/internal/version.version=v0.2.0
// -X github.com/metalvip/metalvip/internal/version.commit=<sha>.
var (
	version string
	commit  string
)

// Info is one build's identity.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns this binary's identity. Without linker flags (`go install`, `go run`) the
// version is the module's as the toolchain recorded it ("(devel)" in a checkout) and the
// commit is the VCS revision when the build recorded one.
func Get() Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info.Version != "" && info.Commit != "" {
		return info
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return withUnknowns(info)
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	if info.Commit == "" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				info.Commit = s.Value
			}
		}
	}
	return withUnknowns(info)
}

func withUnknowns(info Info) Info {
	if info.Version == "" {
		info.Version = "(devel)"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the line every binary prints for --version:
// "metalvip-agent v0.2.0 (commit 0123abc, go1.26.8, linux/arm64)".
func String(binary string) string {
	i := Get()
	return fmt.Sprintf("%s %s (commit %s, %s, %s)", binary, i.Version, i.Commit, i.GoVersion, i.Platform)
}

// Skew says whether an agent of version agent may run with the CCM of version ccm, by the rule
// of docs/upgrading.md: the same major version and at most one minor version apart. It is
// "ok" or "ok: ..." within the rule, "unsupported: ..." outside it, and "unknown: ..." when
// either is not a release (a development build).
func Skew(ccm, agent string) string {
	c, err1 := utilversion.ParseSemantic(ccm)
	a, err2 := utilversion.ParseSemantic(agent)
	if err1 != nil || err2 != nil {
		return "unknown: a development build, not a release"
	}
	if c.Major() != a.Major() {
		return fmt.Sprintf("unsupported: major versions %d and %d", c.Major(), a.Major())
	}
	switch d := int(a.Minor()) - int(c.Minor()); {
	case d == 0:
		return "ok"
	case d == -1:
		return "ok: one minor version older than the CCM"
	case d == 1:
		return "ok: one minor version newer than the CCM"
	default:
		return fmt.Sprintf("unsupported: %d minor versions apart (one is supported)", max(d, -d))
	}
}

// Unsupported says whether a Skew answer is outside the rule.
func Unsupported(skew string) bool { return strings.HasPrefix(skew, "unsupported") }

// Printable is a version or commit another process said, as it may be shown or logged: at most
// 64 characters, anything but printable ASCII replaced, so that a process lying about its
// build cannot flood a log or write escape sequences to a terminal.
func Printable(s string) string {
	b := []byte(s[:min(len(s), 64)])
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return string(b)
}
