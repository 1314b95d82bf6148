package main

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/metalvip/metalvip/nodeagent"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
	"github.com/metalvip/metalvip/test/harness/figure"
	"github.com/metalvip/metalvip/test/kubeapi"
	"github.com/metalvip/metalvip/test/testenv"
)

// apiWrites are the API server's mutating requests so far, by "resource[/subresource] VERB"
// (from its own apiserver_request_total).
func apiWrites(m *testenv.Main, srv *kubeapi.Server) figure.Counts {
	w, _ := apiRequests(m, srv)
	return w
}

// apiRequests are the API server's requests so far, mutating and reading apart.
func apiRequests(m *testenv.Main, srv *kubeapi.Server) (writes, reads figure.Counts) {
	reqs, err := srv.Requests(context.Background())
	if err != nil {
		m.Fatalf("the API server's metrics: %v", err)
	}
	writes, reads = figure.Counts{}, figure.Counts{}
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
