// Package version says which build of metalvip is running: its version and source commit,
// stamped by `-ldflags -X` (make and the image build pass the same flags, see the Makefile's
// LDFLAGS), else taken from what the Go toolchain recorded in the binary. It decides nothing
// else and must not import anything of metalvip's.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
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
