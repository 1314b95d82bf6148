package main

import (
	"flag"
	"os"
	"strings"
	"time"

	"github.com/metalvip/metalvip/test/cluster"
	"github.com/metalvip/metalvip/test/harness"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

var drainsOnly = flag.Bool("drains-only", false, "only the drain sections, in a lab of their own: they replace the sections of the same titles in -out, which keeps the rest")

// drainsAlone measures the drains alone and writes their sections into the report in place
// of the ones of the same titles (a whole make bench takes an hour; the drains take minutes).
func drainsAlone(m *testenv.Main, r *report) {
	ccm, agent, srv := buildAndServe(m)
	harness.Step("the lab: API server, CCM, agents, FRR")
	c := cluster.New(m, srv, cluster.Options{CCMBinary: ccm, AgentBinary: agent})
	for _, n := range c.Lab.Nodes {
		n.ServeName(m, 80)
	}
	bgpDrain(m, r, c, 15*time.Second)
	replaceSections(m, r)
}

// replaceSections writes r's sections into -out in place of the ones of the same titles.
func replaceSections(m *testenv.Main, r *report) {
	old, err := os.ReadFile(*out)
	if err != nil {
		m.Fatalf("%v", err)
	}
	doc := string(old)
	for _, sec := range r.sections {
		doc = replaceSection(doc, sec)
	}
	if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
		m.Fatalf("%v", err)
	}
}

// replaceSection puts sec (starting "## Title\n") in place of doc's section of that title,
// which runs to the next "## "; when doc has none, sec goes after the last section whose
// title starts its own (Drains: L2 after Drains), or at the end.
func replaceSection(doc, sec string) string {
	title, _, _ := strings.Cut(sec, "\n")
	if !strings.HasSuffix(sec, "\n") {
		sec += "\n"
	}
	sec += "\n"
	if i := strings.Index(doc, title+"\n"); i >= 0 {
		end := len(doc)
		if j := strings.Index(doc[i+len(title):], "\n## "); j >= 0 {
			end = i + len(title) + j + 1
		}
		return doc[:i] + sec + doc[end:]
	}
	base, _, _ := strings.Cut(title, ":")
	if i := strings.Index(doc, base+"\n"); i >= 0 {
		end := len(doc)
		if j := strings.Index(doc[i+len(base):], "\n## "); j >= 0 {
			end = i + len(base) + j + 1
		}
		return doc[:end] + sec + doc[end:]
	}
	return strings.TrimRight(doc, "\n") + "\n\n" + sec
}

// buildAndServe builds the CCM and the agent and starts an API server of the bench's own,
// with metalvip's CRDs.
func buildAndServe(m *testenv.Main) (ccm, agent string, srv *kubeapi.Server) {
	harness.Step("building the binaries")
	ccm, agent, err := cluster.Build(m.TempDir())
	if err != nil {
		m.Fatalf("%v", err)
	}
	harness.Step("starting etcd and kube-apiserver")
	srv = kubeapi.Own(m)
	srv.InstallCRDs(m)
	return ccm, agent, srv
}
