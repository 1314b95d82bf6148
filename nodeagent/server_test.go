package nodeagent

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/metalvip/metalvip/internal/agentapi"
	agentv1 "github.com/metalvip/metalvip/proto/metalvip/agent/v1"
)

func TestAnAnswerOverTheLimitIsRefusedWithTheReason(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: agentv1.AgentService_GetState_FullMethodName}
	for _, tc := range []struct {
		name   string
		size   int
		refuse bool
	}{
		{"an answer under the limit goes out", 1 << 20, false},
		{"an answer over the limit is refused", agentapi.MaxMessageBytes + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := limitAnswer(context.Background(), nil, info, func(context.Context, any) (any, error) {
				return &agentv1.GetStateResponse{Node: strings.Repeat("x", tc.size)}, nil
			})
			switch {
			case tc.refuse && (status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "VIPs an agent is sized for")):
				t.Errorf("limitAnswer = %v; want ResourceExhausted with the reason", err)
			case !tc.refuse && (err != nil || resp == nil):
				t.Errorf("limitAnswer = %v, %v; want the answer", resp, err)
			}
		})
	}
}

func TestAMethodNoRoleMayCallIsRefused(t *testing.T) {
	if err := (authorizer{}).allowed(context.Background(), "/metalvip.agent.v1.AgentService/Reboot"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("allowed = %v; want PermissionDenied", err)
	}
}
