package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"

	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/testenv"
)

// testFigures runs the lab tests run (a -run pattern) of pkg, which log their measurements on
// lines starting "FIGURES ", with env added to the environment, and adds those lines to the report as one section: the tests are
// the measurement (with their own checks), the report only gathers what they printed.
func testFigures(m *testenv.Main, r *report, title, method, pkg, run string, env ...string) {
	harness.Step("%s: go test -run %s %s", title, run, pkg)
	cmd := exec.Command("go", "test", "-count=1", "-v", "-timeout", "30m", "-run", run, pkg)
	cmd.Env = append(append(os.Environ(), "METALVIP_REQUIRE_LAB=1"), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		m.Fatalf("go test -run %s %s: %v\n%s", run, pkg, err, buf.String())
	}
	var lines []string
	sc := bufio.NewScanner(&buf)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if _, fig, ok := strings.Cut(sc.Text(), "FIGURES "); ok {
			lines = append(lines, "- "+fig)
		}
	}
	if len(lines) == 0 {
		m.Fatalf("go test -run %s %s printed no FIGURES line:\n%s", run, pkg, buf.String())
	}
	r.add(title, method+"\n\n"+strings.Join(lines, "\n"), nil)
}
