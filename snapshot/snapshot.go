// Package snapshot stacks the sources of one cluster snapshot: a base (a
// live cluster, or manifest files) with manifest files layered on top as
// proposed changes, and deletions. Layering works on whole objects: an
// object of the upper layer replaces the object of the lower layer with the
// same kind, namespace and name (the way `kubectl apply` replaces it in a
// cluster), objects only in the upper layer are added, and nothing is
// merged field by field. Whatever the lower layer reported about a replaced
// object (diagnostics, a failed decode) goes with it.
package snapshot

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// Ref names one object. Namespace is empty for cluster-scoped kinds.
type Ref struct {
	Kind, Namespace, Name string
}

// String is the name diagnostics use: "Kind namespace/name" or "Kind name".
func (r Ref) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// kinds maps what users type (kubectl's names and short names, any case)
// to a kind and whether it is namespaced.
var kinds = map[string]struct {
	kind       string
	namespaced bool
}{
	"namespace": {"Namespace", false}, "namespaces": {"Namespace", false}, "ns": {"Namespace", false},
	"node": {"Node", false}, "nodes": {"Node", false}, "no": {"Node", false},
	"pod": {"Pod", true}, "pods": {"Pod", true}, "po": {"Pod", true},
	"networkpolicy": {"NetworkPolicy", true}, "networkpolicies": {"NetworkPolicy", true}, "netpol": {"NetworkPolicy", true},
	"clusternetworkpolicy": {"ClusterNetworkPolicy", false}, "clusternetworkpolicies": {"ClusterNetworkPolicy", false}, "cnp": {"ClusterNetworkPolicy", false},
}

// ParseRef reads KIND/NAMESPACE/NAME for namespaced kinds and KIND/NAME for
// cluster-scoped ones; KIND is a kind, its plural or kubectl's short name
// (netpol, cnp, po, ns, no), in any case.
func ParseRef(s string) (Ref, error) {
	parts := strings.Split(s, "/")
	k, ok := kinds[strings.ToLower(parts[0])]
	if !ok {
		return Ref{}, fmt.Errorf("%q: unknown kind %q (want Namespace, Node, Pod, NetworkPolicy or ClusterNetworkPolicy)", s, parts[0])
	}
	want := 2
	if k.namespaced {
		want = 3
	}
	if len(parts) != want || slices.Contains(parts, "") {
		if k.namespaced {
			return Ref{}, fmt.Errorf("%q: want %s/NAMESPACE/NAME", s, k.kind)
		}
		return Ref{}, fmt.Errorf("%q: want %s/NAME", s, k.kind)
	}
	if k.namespaced {
		return Ref{Kind: k.kind, Namespace: parts[1], Name: parts[2]}, nil
	}
	return Ref{Kind: k.kind, Name: parts[1]}, nil
}

// Refs lists every object of a cluster.
func Refs(c *policy.Cluster) []Ref {
	var out []Ref
	for _, n := range c.Namespaces {
		out = append(out, Ref{Kind: "Namespace", Name: n.Name})
	}
	for _, n := range c.Nodes {
		out = append(out, Ref{Kind: "Node", Name: n.Name})
	}
	for _, p := range c.Pods {
		out = append(out, Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name})
	}
	for _, np := range c.NetworkPolicies {
		out = append(out, npRef(np))
	}
	for _, cnp := range c.ClusterNetworkPolicies {
		out = append(out, cnpRef(cnp))
	}
	return out
}

func npRef(np *policy.NetworkPolicy) Ref {
	return Ref{Kind: "NetworkPolicy", Namespace: np.Namespace, Name: np.Name}
}

func cnpRef(cnp policy.ClusterNetworkPolicy) Ref {
	return Ref{Kind: "ClusterNetworkPolicy", Name: cnp.Name}
}

// Overlay returns lower with upper layered on top: each object of upper
// replaces lower's object of the same kind, namespace and name, or is
// added. Objects upper could not decode (its Dropped list) replace lower's
// too, so the result still refuses to judge traffic. Neither argument is
// changed.
func Overlay(lower, upper *manifest.Result) *manifest.Result {
	replaced := map[string]bool{}
	for _, r := range Refs(&upper.Cluster) {
		replaced[r.String()] = true
	}
	for _, d := range upper.Dropped {
		replaced[d] = true
	}
	out := without(lower, replaced)
	c := &out.Cluster
	c.Namespaces = append(c.Namespaces, upper.Cluster.Namespaces...)
	c.Nodes = append(c.Nodes, upper.Cluster.Nodes...)
	c.Pods = append(c.Pods, upper.Cluster.Pods...)
	c.NetworkPolicies = append(c.NetworkPolicies, upper.Cluster.NetworkPolicies...)
	c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, upper.Cluster.ClusterNetworkPolicies...)
	out.Diagnostics = append(out.Diagnostics, upper.Diagnostics...)
	out.Dropped = append(out.Dropped, upper.Dropped...)
	out.Skipped = append(out.Skipped, upper.Skipped...)
	return out
}

// Delete returns res without the objects refs name. Naming an object res
// does not hold is an error: a mistyped deletion must not pass silently.
func Delete(res *manifest.Result, refs []Ref) (*manifest.Result, error) {
	have := map[string]bool{}
	for _, r := range Refs(&res.Cluster) {
		have[r.String()] = true
	}
	for _, d := range res.Dropped {
		have[d] = true
	}
	gone := map[string]bool{}
	for _, r := range refs {
		if !have[r.String()] {
			return nil, fmt.Errorf("delete %s: no such object", r)
		}
		gone[r.String()] = true
	}
	return without(res, gone), nil
}

// PrunePolicies returns the policy objects (NetworkPolicies and
// ClusterNetworkPolicies) of res that keep does not define, for deleting
// them: keep then holds the complete set of policies.
func PrunePolicies(res, keep *manifest.Result) []Ref {
	kept := map[string]bool{}
	for _, r := range Refs(&keep.Cluster) {
		kept[r.String()] = true
	}
	for _, d := range keep.Dropped {
		kept[d] = true
	}
	var out []Ref
	for _, np := range res.Cluster.NetworkPolicies {
		if r := npRef(np); !kept[r.String()] {
			out = append(out, r)
		}
	}
	for _, cnp := range res.Cluster.ClusterNetworkPolicies {
		if r := cnpRef(cnp); !kept[r.String()] {
			out = append(out, r)
		}
	}
	return out
}

// without copies res leaving out the objects named in gone (by
// Ref.String) and what was reported about them.
func without(res *manifest.Result, gone map[string]bool) *manifest.Result {
	out := &manifest.Result{}
	c, in := &out.Cluster, &res.Cluster
	for _, n := range in.Namespaces {
		if !gone[Ref{Kind: "Namespace", Name: n.Name}.String()] {
			c.Namespaces = append(c.Namespaces, n)
		}
	}
	for _, n := range in.Nodes {
		if !gone[Ref{Kind: "Node", Name: n.Name}.String()] {
			c.Nodes = append(c.Nodes, n)
		}
	}
	for _, p := range in.Pods {
		if !gone[Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name}.String()] {
			c.Pods = append(c.Pods, p)
		}
	}
	for _, np := range in.NetworkPolicies {
		if !gone[npRef(np).String()] {
			c.NetworkPolicies = append(c.NetworkPolicies, np)
		}
	}
	for _, cnp := range in.ClusterNetworkPolicies {
		if !gone[cnpRef(cnp).String()] {
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, cnp)
		}
	}
	for _, d := range res.Diagnostics {
		if !gone[d.Object] {
			out.Diagnostics = append(out.Diagnostics, d)
		}
	}
	for _, d := range res.Dropped {
		if !gone[d] {
			out.Dropped = append(out.Dropped, d)
		}
	}
	out.Skipped = slices.Clone(res.Skipped)
	return out
}
