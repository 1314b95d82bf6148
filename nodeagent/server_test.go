package nodeagent

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/metalvip/metalvip/internal/certs"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestAMethodNoRoleMayCallIsRefused(t *testing.T) {
	if err := (authorizer{}).allowed(context.Background(), "/metalvip.agent.v1.AgentService/Reboot"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("allowed = %v; want PermissionDenied", err)
	}
}

// TestAddedInterceptorsSeeOnlyTheCallsTheServerAdmits: what WithInterceptors adds (a
// harness counting what lands) runs inside the role check, on the server production runs.
func TestAddedInterceptorsSeeOnlyTheCallsTheServerAdmits(t *testing.T) {
	a, err := New(context.Background(), Options{Node: "node-a", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	h := &harness{agent: a, pki: newPKI(t)}
	tlsCfg, err := certs.ServerConfig(h.pki.files("node-a", "ca"), certs.CCMName, certs.ViewerName)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := NewServer(a, credentials.NewTLS(tlsCfg), true, WithInterceptors(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		mu.Lock()
		seen = append(seen, info.FullMethod)
		mu.Unlock()
		return next(ctx, req)
	}, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = lis.Addr().String()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	viewer := h.viewer(t)
	if _, err := viewer.Apply(context.Background(), &agentv1.ApplyRequest{State: &agentv1.DesiredState{Term: 1, Generation: 1, Node: "node-a"}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the viewer's Apply = %v; want PermissionDenied", err)
	}
	if _, err := viewer.GetState(context.Background(), &agentv1.GetStateRequest{}); err != nil {
		t.Fatalf("the viewer's GetState = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{agentv1.AgentService_GetState_FullMethodName}; !slices.Equal(seen, want) {
		t.Errorf("the added interceptor saw %v, want %v: the refused Apply must not reach it", seen, want)
	}
}
