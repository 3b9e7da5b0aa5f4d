// Package auth checks agent bearer tokens with the Kubernetes TokenReview
// API, as upstream's server does with --agent-namespace,
// --agent-service-account and --authentication-audience.
package auth

import (
	"context"
	"fmt"
	"slices"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TokenReview accepts tokens the API server authenticates as the expected
// service account (and, if Audience is set, for that audience).
type TokenReview struct {
	Client         kubernetes.Interface
	Namespace      string
	ServiceAccount string
	Audience       string
}

// Authenticate implements server.Authenticator.
func (a *TokenReview) Authenticate(ctx context.Context, token string) error {
	tr := &authv1.TokenReview{Spec: authv1.TokenReviewSpec{Token: token}}
	if a.Audience != "" {
		tr.Spec.Audiences = []string{a.Audience}
	}
	res, err := a.Client.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token review: %w", err)
	}
	if !res.Status.Authenticated {
		msg := res.Status.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return fmt.Errorf("token review: %s", msg)
	}
	if a.Audience != "" && !slices.Contains(res.Status.Audiences, a.Audience) {
		return fmt.Errorf("token review: token not valid for audience %q", a.Audience)
	}
	want := "system:serviceaccount:" + a.Namespace + ":" + a.ServiceAccount
	if res.Status.User.Username != want {
		return fmt.Errorf("token review: user %q is not %q", res.Status.User.Username, want)
	}
	return nil
}
