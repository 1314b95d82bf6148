package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/metalvip/metalvip/nodeagent"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// writeCounts are the API server's mutating requests so far, by resource/subresource (from
// its own apiserver_request_total).
type writeCounts map[string]float64

func apiWrites(m *testenv.Main, srv *kubeapi.Server) writeCounts {
	w, _ := apiRequests(m, srv)
	return w
}

// apiRequests are the API server's requests so far, mutating and reading apart.
func apiRequests(m *testenv.Main, srv *kubeapi.Server) (writes, reads writeCounts) {
	reqs, err := srv.Requests(context.Background())
	if err != nil {
		m.Fatalf("the API server's metrics: %v", err)
	}
	writes, reads = writeCounts{}, writeCounts{}
	for _, r := range reqs {
		switch r.Verb {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
			writes[r.Resource+" "+r.Verb] += r.Count
		default:
			reads[r.Resource+" "+r.Verb] += r.Count
		}
	}
	return writes, reads
}

func (w writeCounts) minus(o writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - o[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (w writeCounts) total() float64 {
	t := 0.0
	for _, v := range w {
		t += v
	}
	return t
}

// perService describes writes per Service, largest first.
func (w writeCounts) perService(n int) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(w[b] - w[a]) })
	var parts []string
	for _, k := range keys {
		if per := w[k] / float64(n); per >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, per))
		}
	}
	return strings.Join(parts, ", ")
}

// cpuSeconds is a process's user and system CPU so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // clock ticks (USER_HZ is 100 on Linux)
}

// agentApplies and agentApplyTime count the bench agent's Applies and the time it spent in
// them.
var agentApplies, agentApplyTime atomic.Int64

// benchAgent is the real agent logic without speakers, on a loopback address: the CCM plans,
// pushes and writes its conditions as for a real node, and nothing goes on a wire.
func benchAgent(m *testenv.Main, node string, addr netip.Addr) int {
	a, err := nodeagent.New(context.Background(), nodeagent.Options{Node: node, StateDir: filepath.Join(m.TempDir(), "agent-state")})
	if err != nil {
		m.Fatalf("agent: %v", err)
	}
	m.Cleanup(func() { _ = a.Close(context.Background()) })
	lis, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		m.Fatalf("agent listener: %v", err)
	}
	// The agent's own server, plaintext as the CCM is configured here, timing the Applies.
	srv := nodeagent.NewServer(a, insecure.NewCredentials(), false, nodeagent.WithInterceptors(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != agentv1.AgentService_Apply_FullMethodName {
			return h(ctx, req)
		}
		start := time.Now()
		defer func() { agentApplies.Add(1); agentApplyTime.Add(int64(time.Since(start))) }()
		return h(ctx, req)
	}, nil))
	go func() { _ = srv.Serve(lis) }()
	m.Cleanup(srv.Stop)
	return lis.Addr().(*net.TCPAddr).Port
}
