package kubetest

import (
	"context"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func TestRBACDeniesUnprivilegedUserUntilBound(t *testing.T) {
	env := sharedEnv(t)
	ctx := t.Context()
	cfg, err := env.UserConfig(UnprivilegedUser)
	if err != nil {
		t.Fatal(err)
	}
	user, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := user.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("unprivileged list pods before binding: %v, want Forbidden", err)
	}
	impersonated, err := kubernetes.NewForConfig(env.ImpersonatingConfig(UnprivilegedUser, "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := impersonated.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("admin impersonating %s: list pods before binding: %v, want Forbidden", UnprivilegedUser, err)
	}

	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kubetest-pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubetest-pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubetest-pod-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: UnprivilegedUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The RBAC authorizer reads bindings from an informer: allow it to catch up.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = poll(wctx, func() (bool, error) {
		_, err := user.CoreV1().Pods("default").List(wctx, metav1.ListOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("list pods after binding: %v", err)
	}
	if _, err := impersonated.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("admin impersonating %s: list pods after binding: %v", UnprivilegedUser, err)
	}
	if _, err := user.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list secrets with only pod-reader bound: %v, want Forbidden", err)
	}
	if err := user.CoreV1().Pods("default").Delete(ctx, "anything", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("delete pod with only pod-reader bound: %v, want Forbidden", err)
	}

	if _, err := env.UserConfig("nobody"); err == nil {
		t.Error("UserConfig of a user not in the token file succeeded")
	}
}
