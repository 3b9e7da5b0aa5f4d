package snapshot

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

const live = `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: x, env: prod, kubernetes.io/metadata.name: a}}
---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {zone: z1}}
status: {addresses: [{type: InternalIP, address: 192.0.2.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p, version: v1}}
spec: {nodeName: n1, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {podIP: 10.0.0.1}
`

// A Namespace, Pod or Node of the upper layer is merged into
// the lower layer's as kubectl apply merges a manifest: labels set over
// the live ones (which stay, with a warning naming them), status kept.
func TestOverlayMergesAsApply(t *testing.T) {
	lower := load(t, live)
	upper := load(t, `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: w}}
---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {zone: z2}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {containers: [{name: c}]}
`)
	got := Overlay(lower, upper)
	c := &got.Cluster
	if len(c.Namespaces) != 1 || !maps.Equal(c.Namespaces[0].Labels, map[string]string{"team": "w", "env": "prod", "kubernetes.io/metadata.name": "a"}) {
		t.Errorf("namespace %+v", c.Namespaces)
	}
	if len(c.Nodes) != 1 || c.Nodes[0].Labels["zone"] != "z2" || !slices.Equal(c.Nodes[0].Addrs, []netip.Addr{netip.MustParseAddr("192.0.2.1")}) {
		t.Errorf("node %+v", c.Nodes)
	}
	if len(c.Pods) != 1 {
		t.Fatalf("pods %+v", c.Pods)
	}
	p := c.Pods[0]
	if !maps.Equal(p.Labels, map[string]string{"app": "p", "version": "v1"}) || !slices.Equal(p.IPs, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) || p.NodeName != "n1" || len(p.Ports) != 1 {
		t.Errorf("pod %+v", p)
	}
	var warned []string
	for _, d := range got.Diagnostics {
		if d.Field == "metadata.labels" && d.Severity == policy.SeverityWarning {
			warned = append(warned, d.Object+": "+d.Message)
		}
	}
	slices.Sort(warned)
	if len(warned) != 2 || !strings.HasPrefix(warned[0], "Namespace a: labels env=prod kept from the current state") || !strings.HasPrefix(warned[1], "Pod a/p: labels version=v1 kept") {
		t.Errorf("warnings %q", warned)
	}
	// A manifest with a status (a newer dump) has its own; the lower
	// layer is unchanged.
	newer := load(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nstatus: {podIP: 10.0.0.9}\n")
	if ips := Overlay(lower, newer).Cluster.Pods[0].IPs; !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("10.0.0.9")}) {
		t.Errorf("manifest status: %v", ips)
	}
	if lower.Cluster.Pods[0].Labels["app"] != "p" || len(lower.Cluster.Namespaces[0].Labels) != 3 || lower.Cluster.Nodes[0].Labels["zone"] != "z1" {
		t.Errorf("lower changed: %+v", lower.Cluster)
	}
}

// Deleting a Namespace deletes its Pods and NetworkPolicies,
// deleting a Node its Pods.
func TestDeleteCascades(t *testing.T) {
	res := load(t, base+"---\n"+`apiVersion: v1
kind: Namespace
metadata: {name: b}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: b}
spec: {nodeName: n2}
status: {podIP: 10.0.0.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: other, namespace: b}
spec: {podSelector: {}}
`)
	got, err := Delete(res, []Ref{{Kind: "Namespace", Name: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, r := range Refs(&got.Cluster) {
		left = append(left, r.String())
	}
	want := []string{"Namespace b", "Pod b/q", "NetworkPolicy b/other", "ClusterNetworkPolicy c"}
	if !slices.Equal(left, want) || len(got.Dropped) != 0 {
		t.Errorf("after deleting namespace a: %v, dropped %v; want %v", left, got.Dropped, want)
	}
	got, err = Delete(load(t, live+"---\n"+base[strings.Index(base, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: keep"):]), []Ref{{Kind: "Node", Name: "n1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Cluster.Pods) != 0 || len(got.Cluster.Nodes) != 0 || len(got.Cluster.Namespaces) != 1 {
		t.Errorf("after deleting node n1: %+v", got.Cluster)
	}
}

// A label that the live object's last-applied-configuration names and the
// manifest no longer sets is removed, as client-side kubectl apply
// removes it; the others are kept without a warning (known not to be
// apply's).
func TestOverlayLastApplied(t *testing.T) {
	lower := load(t, `apiVersion: v1
kind: Namespace
metadata:
  name: a
  labels: {team: x, env: prod, owner: o}
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{"apiVersion":"v1","kind":"Namespace","metadata":{"labels":{"team":"x","env":"prod"},"name":"a"}}'
    other: ignored
`)
	upper := load(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: w}}\n")
	got := Overlay(lower, upper)
	if len(got.Cluster.Namespaces) != 1 || !maps.Equal(got.Cluster.Namespaces[0].Labels, map[string]string{"team": "w", "owner": "o"}) {
		t.Errorf("namespace %+v", got.Cluster.Namespaces)
	}
	for _, d := range got.Diagnostics {
		t.Errorf("unexpected diagnostic %v", d)
	}
	// Deleting, pruning and layering again keep what is known.
	if l := got.LastApplied["Namespace a"]; l != nil {
		t.Errorf("the manifest carried no annotation, yet %v", l)
	}
	if d, err := Delete(lower, nil); err != nil || !d.LastApplied["Namespace a"]["env"] {
		t.Errorf("Delete lost last-applied: %v, %v", d.LastApplied, err)
	}
}
