package images_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/moat-net/moat/deploy"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
)

// The cluster the agent container enforces for its node: a server pod and a
// client pod on the node, a pod elsewhere, a NetworkPolicy with a port range
// (KEP-2079) and a named port, and an Admin ClusterNetworkPolicy.
const imageNode = "image-node"

const clusterYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Node
metadata: {name: image-node}
---
apiVersion: v1
kind: Node
metadata: {name: other-node}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  nodeName: image-node
  containers:
  - {name: web, image: example.invalid/web, ports: [{name: http, containerPort: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: shop, labels: {app: client}}
spec:
  nodeName: image-node
  containers: [{name: client, image: example.invalid/client}]
---
apiVersion: v1
kind: Pod
metadata: {name: elsewhere, namespace: shop, labels: {app: client}}
spec:
  nodeName: other-node
  containers: [{name: client, image: example.invalid/client}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports:
    - {protocol: TCP, port: 30000, endPort: 32767}
    - {protocol: TCP, port: http}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-metadata}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  egress:
  - name: metadata-service
    action: Deny
    to: [{networks: [169.254.169.254/32]}]
`

var podIPs = map[string]string{"web": "10.77.0.2", "client": "10.77.0.3", "elsewhere": "10.77.1.5"}

const nodeIP = "192.0.2.10"

// testAgentImage runs the agent image as the DaemonSet would (its
// arguments, host network, read-only root file system) against a real API
// server, authenticated as the agent's ServiceAccount under the shipped
// RBAC. To leave the host's nftables alone it programs a network namespace
// of the test's (--netns, which needs SYS_ADMIN besides the DaemonSet's
// capabilities to enter it). It checks
// that the container becomes ready, programs the node's table from the
// cluster's objects, follows a change, and writes policy status.
func testAgentImage(ctx context.Context, t *testing.T, pm *podman, image string) {
	crds, err := deploy.CRDs(deploy.Standard)
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(crds))

	// The agent's namespace, ServiceAccount and RBAC as shipped.
	objs, err := kubetest.AgentManifests()
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kubetest.DecodeYAML([]byte(clusterYAML))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, append(objs, cluster...), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := env.Client.CoreV1().Nodes().Get(ctx, imageNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for pod, ip := range podIPs {
		if _, err := kubetest.SetPodIPs(ctx, env.Client, "shop", pod, ip); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	sa, err := env.ServiceAccountConfig(ctx, "moat-system", "moat-agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), sa); err != nil {
		t.Fatal(err)
	}

	netns := fmt.Sprintf("moatimg-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", netns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", netns).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v\n%s", netns, err, out)
		}
	})

	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	args := daemonSetArgs(t, map[string]string{
		"--metrics-bind-address": fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		"--health-bind-address":  health,
	})
	args = append(args, "--kubeconfig=/etc/moat/kubeconfig", "--netns="+netns, "-v=2")
	container := netns + "-agent"
	// The DaemonSet's capabilities and nothing else but SYS_ADMIN, which
	// only --netns needs (setns into the test's namespace; the DaemonSet
	// programs the host's own): so a capability the agent needs and the
	// manifest lacks fails here (NET_RAW was granted
	// unused while this ran --privileged).
	caps := []string{"--cap-drop=all", "--cap-add=SYS_ADMIN", "--security-opt=no-new-privileges"}
	for _, c := range daemonSetCapabilities(t) {
		caps = append(caps, "--cap-add="+c)
	}
	pm.start(ctx, t, container, append(append([]string{
		"--network", "host",
		"--read-only", "--tmpfs", "/tmp", "--tmpfs", "/run/moat",
		"--env", "NODE_NAME=" + imageNode,
		"--volume", filepath.Join(dir, "kubeconfig") + ":/etc/moat/kubeconfig:ro",
		"--volume", "/run/netns/" + netns + ":/run/netns/" + netns,
	}, caps...), append([]string{image}, args...)...)...)

	// Ready: the first full sync from complete caches is programmed.
	waitHTTP(ctx, t, pm, container, "http://"+health+"/readyz", 2*time.Minute)

	table := listTable(t, netns)
	// How sets are shared and laid out is the nft package's business (and
	// changes); what must be there is each fact of the input, once rendered.
	for _, want := range []struct{ what, text string }{
		{"the table's owner comment", `comment "moat: network policy`},
		{"the port range (endPort)", "tcp . 30000-32767"},
		{"the named port http, resolved on pod web", "tcp . 8080"},
		{"the client pod on the other node as a peer", podIPs["elsewhere"]},
		{"the Admin Deny's network", "169.254.169.254"},
		{"the NetworkPolicy's isolation counter", `comment "drop isolation ingress NetworkPolicy shop/web-ingress"`},
		{"the Admin Deny's drop counter", `comment "drop deny egress rule 0 ClusterNetworkPolicy deny-metadata"`},
	} {
		if !strings.Contains(table, want.text) {
			t.Errorf("table inet moat lacks %s (%q):\n%s", want.what, want.text, table)
		}
	}
	// The node's own pods, and only they, are policed here.
	local := listObject(t, netns, "set", "local4")
	for _, pod := range []string{"web", "client"} {
		if !strings.Contains(local, podIPs[pod]) {
			t.Errorf("set local4 lacks pod %s (%s):\n%s", pod, podIPs[pod], local)
		}
	}
	if strings.Contains(local, podIPs["elsewhere"]) {
		t.Errorf("set local4 holds pod elsewhere (%s), which runs on another node:\n%s", podIPs["elsewhere"], local)
	}
	if nl := listObject(t, netns, "set", "nodelocal4"); !strings.Contains(nl, nodeIP) {
		t.Errorf("set nodelocal4 lacks the node's address %s (node-local traffic):\n%s", nodeIP, nl)
	}
	if in := listObject(t, netns, "map", "ingress4"); !strings.Contains(in, podIPs["web"]+" : ") {
		t.Errorf("map ingress4 sends no ingress of pod web (%s), which a NetworkPolicy isolates, to a chain:\n%s", podIPs["web"], in)
	}
	if t.Failed() {
		return
	}

	// The container keeps watching: narrowing the range reaches the table.
	patch := []byte(`{"spec":{"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}}],"ports":[{"protocol":"TCP","port":30000,"endPort":31000},{"protocol":"TCP","port":"http"}]}]}}`)
	if _, err := env.Client.NetworkingV1().NetworkPolicies("shop").Patch(ctx, "web-ingress", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the narrowed range in table inet moat", func() (bool, string) {
		table := listTable(t, netns)
		return strings.Contains(table, "tcp . 30000-31000") && !strings.Contains(table, "30000-32767"), table
	})

	// The agent is the only one, so it leads and writes status.
	cnps := env.Dynamic.Resource(schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1alpha2", Resource: "clusternetworkpolicies"})
	eventually(t, time.Minute, "Accepted=True on ClusterNetworkPolicy deny-metadata", func() (bool, string) {
		u, err := cnps.Get(ctx, "deny-metadata", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Accepted" && m["status"] == "True" {
				return true, ""
			}
		}
		return false, fmt.Sprint(conds)
	})

	// SIGTERM (what the kubelet sends) stops it cleanly, and the rules stay.
	if out, err := pm.run(ctx, "stop", "--time", "20", container); err != nil {
		t.Fatalf("podman stop: %v\n%s", err, out)
	}
	if _, state := pm.running(ctx, container); state != "exited exit=0" {
		t.Errorf("after SIGTERM the agent container is %q, want exited with code 0", state)
	}
	if !strings.Contains(listTable(t, netns), "tcp . 30000-31000") {
		t.Error("table inet moat was removed when the agent stopped; the rules must outlive the agent")
	}
}

// daemonSetArgs returns the agent container's arguments from
// deploy/agent/daemonset.yaml, with $(NODE_NAME) expanded and the given
// flags' values replaced (the test binds its own loopback ports).
func daemonSetArgs(t *testing.T, replace map[string]string) []string {
	t.Helper()
	ds, err := kubetest.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
		name, _, _ := strings.Cut(a, "=")
		if v, ok := replace[name]; ok {
			a = name + "=" + v
		}
		args = append(args, strings.ReplaceAll(a, "$(NODE_NAME)", imageNode))
	}
	return args
}

// daemonSetCapabilities are the capabilities the DaemonSet adds.
func daemonSetCapabilities(t *testing.T) []string {
	t.Helper()
	ds, err := kubetest.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("deploy/agent/daemonset.yaml: no capabilities")
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, string(c))
	}
	return caps
}

// listTable lists table inet moat in the namespace with the host's nft.
func listTable(t *testing.T, netns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", netns, "nft", "list", "table", "inet", "moat").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table inet moat in %s: %v\n%s", netns, err, out)
	}
	return string(out)
}

// listObject lists one set or map of table inet moat in the namespace.
func listObject(t *testing.T, netns, kind, name string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", netns, "nft", "list", kind, "inet", "moat", name).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list %s inet moat %s in %s: %v\n%s", kind, name, netns, err, out)
	}
	return string(out)
}

// eventually polls cond until it holds, failing with its last detail.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	detail := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, detail = cond(); ok {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last:\n%s", timeout, what, detail)
}
