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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	agentoptions "github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/auth"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// TestTokenReviewRealAPIServer checks agent tokens with a real kube-apiserver:
// the server reviews tokens as upstream's system:konnectivity-server user
// with deploy/tunnel's RBAC (as in a cluster); an agent with a token for the
// agent service account and audience gets a tunnel, tokens for another
// account or audience do not; tokens bound to a pod or Node hold the agent
// to that node and to the addresses its Node lists, the DaemonSet agent of
// deploy/tunnel included.
func TestTokenReviewRealAPIServer(t *testing.T) {
	if testing.Short() {
		testenv.Require(t, "a run without -short (this test starts a real kube-apiserver)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := kubetest.Start(ctx, t)
	const ns, audience = "kube-system", "system:konnectivity-server"
	for _, sa := range []string{"konnectivity-agent", "someone-else"} {
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The server runs as upstream's konnectivity-server user with exactly
	// the shipped RBAC: token reviews, and the Nodes tokens are bound to.
	rbac, err := os.ReadFile("../../deploy/tunnel/moat-proxy-server-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeYAML(rbac)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.ImpersonatingConfig("system:konnectivity-server"))
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
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: auth.New(auth.Config{Client: cs, Namespace: ns, ServiceAccount: "konnectivity-agent", Audience: audience}),
		Nodes: auth.Nodes{Client: cs}}})
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
	// Their Node objects list their addresses, as kubelets report them:
	// node-a's agent may claim node-a's, not node-b's.
	node := func(name string, addrs ...corev1.NodeAddress) *corev1.Node {
		n, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = addrs
		if n, err = env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	nodeObj := node("node-a", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "2001:db8::a"},
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node-a.example"})
	node("node-b", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.11"})
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

	// deploy/tunnel's DaemonSet agent as its pod on node-a runs: the
	// manifest applied for real (its ServiceAccount, its pod template), a
	// token for that pod with the audience the template projects (what the
	// kubelet writes), and its command line with the downward API's values
	// (node-a's name, its node IP).
	dsYAML, err := os.ReadFile("../../deploy/tunnel/moat-proxy-agent-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if objs, err = kubetest.DecodeYAML(dsYAML); err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	ds, err := env.Client.AppsV1().DaemonSets(ns).Get(ctx, "moat-proxy-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dsPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "moat-proxy-agent-node-a", Labels: ds.Spec.Template.Labels}, Spec: *ds.Spec.Template.Spec.DeepCopy()}
	dsPod.Spec.NodeName = "node-a"
	if dsPod, err = env.Client.CoreV1().Pods(ns).Create(ctx, dsPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var projected *corev1.ServiceAccountTokenProjection
	for _, v := range dsPod.Spec.Volumes {
		if v.Projected != nil && len(v.Projected.Sources) > 0 && v.Projected.Sources[0].ServiceAccountToken != nil {
			projected = v.Projected.Sources[0].ServiceAccountToken
		}
	}
	if projected == nil || projected.Audience != audience || dsPod.Spec.ServiceAccountName != "konnectivity-agent" {
		t.Fatalf("DaemonSet: projected token %+v of service account %q, want audience %q of konnectivity-agent", projected, dsPod.Spec.ServiceAccountName, audience)
	}
	dsToken := bound(authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: dsPod.Name, UID: dsPod.UID})
	dsArgs := func(node, hostIP string) (agentID, idents string) {
		o, err := agentoptions.New()
		if err != nil {
			t.Fatal(err)
		}
		env := strings.NewReplacer("$(NODE_NAME)", node, "$(HOST_IP)", hostIP)
		var args []string
		for _, a := range dsPod.Spec.Containers[0].Command[1:] {
			args = append(args, env.Replace(a))
		}
		if err := flagSet("daemonset", o.Flags()).Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		if o.ServiceAccountTokenPath == "" || o.AgentCert != "" {
			t.Fatalf("DaemonSet agent: token path %q, certificate %q; want a token only", o.ServiceAccountTokenPath, o.AgentCert)
		}
		return o.AgentIDFor(nil), o.AgentIdentifiers
	}
	dsID, dsIdents := dsArgs("node-a", "192.0.2.10")
	// The same pod's token with node-b's name and node IP.
	dsIDB, dsIdentsB := dsArgs("node-b", "192.0.2.11")
	for _, c := range []struct {
		name, token, agentID, idents string
		creds                        credentials.TransportCredentials
		wantErr                      string
	}{
		{"pod-bound token as its node", podToken, "node-a", "", shared, ""},
		{"Node-bound token as its node", nodeToken, "node-a", "", shared, ""},
		{"pod-bound token, its Node's addresses", podToken, "node-a", "ipv4=192.0.2.10&ipv6=2001:db8::a&host=node-a.example&default-route=true", shared, ""},
		{"Node-bound token, its Node's address", nodeToken, "node-a", "ipv4=192.0.2.10", shared, ""},
		{"pod-bound token, another Node's address", podToken, "node-a", "ipv4=192.0.2.11", shared, `identifier 192.0.2.11 is not an IP address of Node "node-a"'s status.addresses`},
		{"pod-bound token as another agent", podToken, "agent-x", "", shared, `token (TokenReview node-name) names node "node-a"`},
		{"Node-bound token as another node", nodeToken, "node-b", "ipv4=192.0.2.11", shared, `names node "node-a"`},
		{"pod-bound token, certificate of another node", podToken, "node-a", "", nodeB, `names node "node-b" but its token`},
		{"DaemonSet agent on its node", dsToken, dsID, dsIdents, shared, ""},
		{"DaemonSet agent's token with another node's flags", dsToken, dsIDB, dsIdentsB, shared, `names node "node-a"`},
		{"DaemonSet agent claiming another node's IP", dsToken, dsID, strings.Replace(dsIdents, "192.0.2.10", "192.0.2.11", 1), shared, "identifier 192.0.2.11 is not an IP address"},
	} {
		md := metadata.Pairs(proto.MetaAgentID, c.agentID, proto.MetaAuthorization, "Bearer "+c.token)
		if c.idents != "" {
			md.Set(proto.MetaAgentIdentifiers, c.idents)
		}
		err := tryConnect(t, ps.agentAddr, c.creds, md)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.wantErr != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: got %v, want PermissionDenied with %q", c.name, err, c.wantErr)
		}
	}

	// Without --authentication-audience the review asks for no audience,
	// and kube-apiserver answers for its own: a token for this server's
	// audience (the DaemonSet's) is refused, and the agent needs a token
	// valid for kube-apiserver itself, one the proxy server could replay
	// there. What moat-proxy-server's start-up warning says.
	noAud := startServer(t, p, serverOpts{cfg: server.Config{Auth: auth.New(auth.Config{Client: cs, Namespace: ns, ServiceAccount: "konnectivity-agent"}),
		Nodes: auth.Nodes{Client: cs}}})
	exp := int64(3600)
	apiTok, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "konnectivity-agent", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{}) // kube-apiserver's audiences
	if err != nil {
		t.Fatal(err)
	}
	konnTok, err := os.ReadFile(token("konnectivity-agent", audience))
	if err != nil {
		t.Fatal(err)
	}
	try := func(tok string) error {
		return tryConnect(t, noAud.agentAddr, shared, metadata.Pairs(proto.MetaAgentID, "agent-x", proto.MetaAuthorization, "Bearer "+tok))
	}
	if err := try(string(konnTok)); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "is invalid for the target audiences") {
		t.Errorf("no audience, token for %s: got %v, want Unauthenticated (not for kube-apiserver's audiences)", audience, err)
	}
	if err := try(apiTok.Status.Token); err != nil {
		t.Errorf("no audience, token for kube-apiserver's audiences: refused: %v", err)
	}
}

// TestRecheckRealAPIServer: with a real kube-apiserver and the shipped
// RBAC, a connected agent's pod-bound token and Node addresses are checked
// again while its tunnel lives. Deleting the agent's pod invalidates its
// token and ends its tunnel (after the 10 s success cache); a Node whose
// address moves ends its agent's tunnel, and the address's new owner then
// gets all its connections. Before, both agents kept their tunnels and
// claims, and the stale one carried a share of the new owner's connections.
func TestRecheckRealAPIServer(t *testing.T) {
	if testing.Short() {
		testenv.Require(t, "a run without -short (this test starts a real kube-apiserver)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := kubetest.Start(ctx, t)
	const ns, audience, sa = "kube-system", "system:konnectivity-server", "konnectivity-agent"
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rbac, err := os.ReadFile("../../deploy/tunnel/moat-proxy-server-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeYAML(rbac)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.ImpersonatingConfig("system:konnectivity-server"))
	if err != nil {
		t.Fatal(err)
	}
	setAddr := func(n *corev1.Node, ip string) *corev1.Node {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		n, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	newNode := func(name, ip string) *corev1.Node {
		n, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return setAddr(n, ip)
	}
	// podAgent runs an agent for node with a token bound to a pod there,
	// claiming ip.
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{cfg: server.Config{
		Auth:            auth.New(auth.Config{Client: cs, Namespace: ns, ServiceAccount: sa, Audience: audience}),
		Nodes:           auth.Nodes{Client: cs},
		IdentityBinding: server.BindRequired,
		Strategies:      []server.Strategy{server.StrategyDestHost, server.StrategyDefault},
		RecheckInterval: time.Second,
	}})
	podAgent := func(node, ip string) (*corev1.Pod, *proxyAgent) {
		pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "a", Image: "a"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		exp := int64(3600)
		tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
			Audiences: []string{audience}, ExpirationSeconds: &exp,
			BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte(tr.Status.Token), 0o600); err != nil {
			t.Fatal(err)
		}
		a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
			c.TokenPath, c.AgentID, c.Identifiers = f, node, "ipv4="+ip
		})
		eventually(t, node+"'s agent", a.a.Ready)
		return pod, a
	}
	waitClosed := func(what string, a *proxyAgent) {
		t.Helper()
		deadline := time.Now().Add(40 * time.Second) // the 10 s token cache, then a re-check
		for a.a.Ready() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the tunnel is still up", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	nodeA := newNode("node-a", "127.0.0.1")
	podA, a := podAgent("node-a", "127.0.0.1")
	nodeC := newNode("node-c", "127.0.0.3")
	_, c := podAgent("node-c", "127.0.0.3")

	// node-c's Node now lists another address: its agent's claim is stale.
	setAddr(nodeC, "127.0.0.4")
	waitClosed("node-c's Node no longer lists 127.0.0.3", c)
	// node-a's pod is deleted, which invalidates its token.
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, podA.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitClosed("node-a's pod deleted (its token invalidated)", a)

	// 127.0.0.1 now belongs to node-b; node-a's agent cannot come back.
	setAddr(nodeA, "127.0.0.2")
	newNode("node-b", "127.0.0.1")
	_, b := podAgent("node-b", "127.0.0.1")
	hs := httpBackend(t) // at 127.0.0.1: node-b's kubelet
	for range 30 {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := grpcDial(dctx, t, p, ps.frontAddr, hs.Listener.Addr().String())
		dcancel()
		if err != nil {
			t.Fatalf("dial node-b's address: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
	}
	if a.a.Active() != 0 || c.a.Active() != 0 || b.a.Active() != 30 {
		t.Errorf("30 connections to node-b's address: node-b's agent carries %d, node-a's (revoked) %d, node-c's (stale) %d; want all on node-b's",
			b.a.Active(), a.a.Active(), c.a.Active())
	}
}
