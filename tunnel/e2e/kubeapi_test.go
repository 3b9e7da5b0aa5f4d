package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/auth"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// TestTokenReviewRealAPIServer checks agent tokens with a real kube-apiserver:
// the server reviews tokens with its own service account bound to
// system:auth-delegator (as in a cluster); an agent with a token for the
// agent service account and audience gets a tunnel, tokens for another
// account or audience do not.
func TestTokenReviewRealAPIServer(t *testing.T) {
	if testing.Short() {
		testenv.Require(t, "a run without -short (this test starts a real kube-apiserver)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := kubetest.Start(ctx, t)
	const ns, audience = "kube-system", "system:konnectivity-server"
	for _, sa := range []string{"konnectivity-agent", "konnectivity-server", "someone-else"} {
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "konnectivity-server:auth-delegator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "konnectivity-server"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	srvCfg, err := env.ServiceAccountConfig(ctx, ns, "konnectivity-server")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa, aud string) string {
		exp := int64(3600)
		tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authv1.TokenRequest{
			Spec: authv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: &exp}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte(tr.Status.Token), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: auth.New(auth.Config{Client: cs, Namespace: ns, ServiceAccount: "konnectivity-agent", Audience: audience})}})
	good := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.TokenPath = token("konnectivity-agent", audience) })
	otherSA := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.TokenPath = token("someone-else", audience) })
	otherAud := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.TokenPath = token("konnectivity-agent", "https://kubernetes.default.svc") })
	eventually(t, "agent with a valid token", good.a.Ready)
	time.Sleep(500 * time.Millisecond)
	if otherSA.a.Ready() || otherAud.a.Ready() || ps.srv.Backends() != 1 {
		t.Fatalf("rejected tokens got tunnels: other SA %v, other audience %v, backends %d", otherSA.a.Ready(), otherAud.a.Ready(), ps.srv.Backends())
	}

	// Tokens bound to a pod on node-a or to the Node node-a name it (the
	// review's authentication.kubernetes.io/node-name extra): with the
	// default identity binding such an agent must be node-a, and a client
	// certificate naming another node contradicts it. The unbound tokens
	// above name no node and were accepted under any agentID.
	nodeObj, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "konnectivity-agent-a"},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "konnectivity-agent", Containers: []corev1.Container{{Name: "agent", Image: "agent"}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := func(ref authv1.BoundObjectReference) string {
		exp := int64(3600)
		tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "konnectivity-agent", &authv1.TokenRequest{
			Spec: authv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp, BoundObjectRef: &ref}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	podToken := bound(authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	nodeToken := bound(authv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeObj.Name, UID: nodeObj.UID})
	shared := agentCreds(t, p, p.agent)
	nodeB := agentCreds(t, p, issue(t, p, "system:node:node-b"))
	for _, c := range []struct {
		name, token, agentID string
		creds                credentials.TransportCredentials
		wantErr              string
	}{
		{"pod-bound token as its node", podToken, "node-a", shared, ""},
		{"Node-bound token as its node", nodeToken, "node-a", shared, ""},
		{"pod-bound token as another agent", podToken, "agent-x", shared, `token (TokenReview node-name) names node "node-a"`},
		{"Node-bound token as another node", nodeToken, "node-b", shared, `names node "node-a"`},
		{"pod-bound token, certificate of another node", podToken, "node-a", nodeB, `names node "node-b" but its token`},
	} {
		err := tryConnect(t, ps.agentAddr, c.creds, metadata.Pairs(proto.MetaAgentID, c.agentID, proto.MetaAuthorization, "Bearer "+c.token))
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.wantErr != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: got %v, want PermissionDenied with %q", c.name, err, c.wantErr)
		}
	}
}
