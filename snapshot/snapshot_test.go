package snapshot

import (
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Ref
		wantErr string
	}{
		{in: "NetworkPolicy/ns1/p", want: Ref{"NetworkPolicy", "ns1", "p"}},
		{in: "netpol/ns1/p", want: Ref{"NetworkPolicy", "ns1", "p"}},
		{in: "cnp/deny-all", want: Ref{Kind: "ClusterNetworkPolicy", Name: "deny-all"}},
		{in: "Pods/a/b", want: Ref{"Pod", "a", "b"}},
		{in: "ns/frontend", want: Ref{Kind: "Namespace", Name: "frontend"}},
		{in: "no/n1", want: Ref{Kind: "Node", Name: "n1"}},
		{in: "netpol/p", wantErr: "want NetworkPolicy/NAMESPACE/NAME"},
		{in: "cnp/a/b", wantErr: "want ClusterNetworkPolicy/NAME"},
		{in: "pod//x", wantErr: "want Pod/NAMESPACE/NAME"},
		{in: "service/a/b", wantErr: `unknown kind "service"`},
	} {
		got, err := ParseRef(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func load(t *testing.T, yaml string) *manifest.Result {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(yaml)}).Load("-")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

const base = `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: x}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
status: {podIP: 10.0.0.1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: a}
spec: {podSelector: {}, bogus: 1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: keep, namespace: a}
spec: {podSelector: {}}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c}
spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}
---
apiVersion: networking.k8s.io/v2
kind: NetworkPolicy
metadata: {name: broken, namespace: a}
`

// The upper layer replaces whole objects: the replaced object's
// diagnostics and failed decode go with it; new objects are added.
func TestOverlay(t *testing.T) {
	lower := load(t, base)
	if len(lower.Dropped) != 1 || len(lower.Diagnostics) == 0 {
		t.Fatalf("fixture: dropped %v, diagnostics %v", lower.Dropped, lower.Diagnostics)
	}
	upper := load(t, `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: z}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: a}
spec: {podSelector: {matchLabels: {app: p}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: a}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: new, namespace: a}
spec: {podSelector: {}}
`)
	got := Overlay(lower, upper)
	if len(got.Dropped) != 0 {
		t.Errorf("dropped %v: the replaced broken object should be gone", got.Dropped)
	}
	for _, d := range got.Diagnostics {
		if d.Object == "NetworkPolicy a/np" {
			t.Errorf("diagnostic of the replaced object kept: %v", d)
		}
	}
	if len(got.Cluster.Namespaces) != 1 || got.Cluster.Namespaces[0].Labels["team"] != "z" {
		t.Errorf("namespaces %+v", got.Cluster.Namespaces)
	}
	var nps []string
	for _, np := range got.Cluster.NetworkPolicies {
		nps = append(nps, np.Name)
		if np.Name == "np" && np.Spec.PodSelector.MatchLabels["app"] != "p" {
			t.Errorf("np not replaced: %+v", np.Spec)
		}
	}
	slices.Sort(nps)
	if !slices.Equal(nps, []string{"broken", "keep", "new", "np"}) {
		t.Errorf("policies %v", nps)
	}
	if len(got.Cluster.Pods) != 1 || len(got.Cluster.ClusterNetworkPolicies) != 1 {
		t.Errorf("untouched objects lost: %+v", got.Cluster)
	}
	// The arguments are unchanged.
	if len(lower.Cluster.NetworkPolicies) != 2 || len(lower.Dropped) != 1 {
		t.Errorf("lower changed: %+v", lower)
	}

	// An object upper could not decode replaces lower's, and the result
	// still refuses to judge traffic.
	bad := load(t, "apiVersion: networking.k8s.io/v9\nkind: NetworkPolicy\nmetadata: {name: keep, namespace: a}\n")
	got = Overlay(lower, bad)
	if !slices.Contains(got.Dropped, "NetworkPolicy a/keep") {
		t.Errorf("dropped %v", got.Dropped)
	}
	for _, np := range got.Cluster.NetworkPolicies {
		if np.Name == "keep" {
			t.Error("lower's copy of an object upper failed to decode was kept")
		}
	}
}

func TestDeleteAndPrune(t *testing.T) {
	res := load(t, base)
	got, err := Delete(res, []Ref{{Kind: "NetworkPolicy", Namespace: "a", Name: "np"}, {Kind: "ClusterNetworkPolicy", Name: "c"}, {Kind: "NetworkPolicy", Namespace: "a", Name: "broken"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Cluster.NetworkPolicies) != 1 || len(got.Cluster.ClusterNetworkPolicies) != 0 || len(got.Dropped) != 0 {
		t.Errorf("after delete: %+v, dropped %v", got.Cluster, got.Dropped)
	}
	for _, d := range got.Diagnostics {
		if d.Object == "NetworkPolicy a/np" {
			t.Errorf("diagnostic of a deleted object kept: %v", d)
		}
	}
	if _, err := Delete(res, []Ref{{Kind: "NetworkPolicy", Namespace: "b", Name: "np"}}); err == nil || !strings.Contains(err.Error(), "NetworkPolicy b/np: no such object") {
		t.Errorf("deleting a missing object: %v", err)
	}

	keep := load(t, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: keep, namespace: a}\nspec: {podSelector: {}}\n")
	pruned := PrunePolicies(res, keep)
	var names []string
	for _, r := range pruned {
		names = append(names, r.String())
	}
	if !slices.Equal(names, []string{"NetworkPolicy a/np", "ClusterNetworkPolicy c"}) {
		t.Errorf("pruned %v", names)
	}
}
