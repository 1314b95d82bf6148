package identity

import (
	"context"
	"fmt"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// review asks the API server who the token is, and refuses it unless it is the agents'
// ServiceAccount, for the agents' audience, bound to a Pod on node. The API server checks the
// signature, the expiry and that the Pod still exists (a token of a deleted Pod is refused).
func (a *Authority) review(ctx context.Context, node, token string) error {
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		// Not the agent's fault: the API server did not answer. Not a refusal.
		return fmt.Errorf("token review for node %s: %w", node, err)
	}
	return Check(tr.Status, node, a.opts.Namespace, a.opts.ServiceAccount)
}

// Check decides a TokenReview's answer for an agent that claims node: it must be
// authenticated, for Audience, the ServiceAccount namespace/serviceAccount, and bound to a Pod
// whose Node is node. A refusal wraps ErrRefused and says which of these failed.
func Check(st authenticationv1.TokenReviewStatus, node, namespace, serviceAccount string) error {
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return fmt.Errorf("%w: the token of the agent on %s is not valid: %s", ErrRefused, node, reason)
	}
	if !slices.Contains(st.Audiences, Audience) {
		return fmt.Errorf("%w: the token of the agent on %s is for %q, not %q", ErrRefused, node, st.Audiences, Audience)
	}
	want := "system:serviceaccount:" + namespace + ":" + serviceAccount
	if st.User.Username != want {
		return fmt.Errorf("%w: the token of the agent on %s is %s's, not the agents' ServiceAccount %s", ErrRefused, node, st.User.Username, want)
	}
	if pods := st.User.Extra[PodNameExtra]; len(pods) != 1 {
		return fmt.Errorf("%w: the token of the agent on %s is bound to no Pod; mount a projected ServiceAccount token (docs/agent-tls.md)", ErrRefused, node)
	}
	nodes := st.User.Extra[NodeNameExtra]
	if len(nodes) != 1 {
		return fmt.Errorf("%w: the token of the agent on %s names no Node (its Pod was not scheduled when it was made)", ErrRefused, node)
	}
	if nodes[0] != node {
		return fmt.Errorf("%w: the agent dialled as %s holds a token of a Pod on %s", ErrRefused, node, nodes[0])
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("%w: %q is no node name: %v", ErrRefused, node, errs)
	}
	return nil
}
