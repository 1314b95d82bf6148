package nodeagent

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestAMethodNoRoleMayCallIsRefused(t *testing.T) {
	if err := (authorizer{}).allowed(context.Background(), "/metalvip.agent.v1.AgentService/Reboot"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("allowed = %v; want PermissionDenied", err)
	}
}
