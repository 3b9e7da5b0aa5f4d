// Package snapshot stacks the sources of one cluster snapshot: a base (a
// live cluster, or manifest files) with manifest files layered on top as
// proposed changes, and deletions.
//
// Layering models kubectl apply for what policy reads. A policy
// (NetworkPolicy, ClusterNetworkPolicy) of the upper layer replaces the
// lower layer's of the same kind, namespace and name whole: its manifest is
// all of its spec. A Namespace, Pod or Node of the upper layer that the
// lower layer has is merged into it as apply merges a manifest into a live
// object: its labels are set (added or changed) and the lower layer's other
// labels are kept, since apply keeps labels it did not set (kubectl label,
// controllers); status, which apply never writes, is kept (a pod's IPs, a
// node's addresses) unless the manifest has one; so are the pod's node,
// ports and host network when the manifest leaves them out (they are
// immutable). A label that the live object's
// kubectl.kubernetes.io/last-applied-configuration names and the manifest
// no longer sets is removed, as client-side apply removes it. Without that
// annotation, which labels an earlier apply set is unknown (server-side
// apply's managed fields are not read): the labels kept then draw a
// warning that names them. Objects only in the upper layer are added. Whatever the
// lower layer reported about an object the upper layer sets (diagnostics,
// a failed decode) goes with it.
//
// Deleting a Namespace deletes its Pods and NetworkPolicies too, and
// deleting a Node its Pods, as Kubernetes' namespace controller and pod
// garbage collector do.
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

// Overlay returns lower with upper layered on top (see the package
// comment): each policy of upper replaces lower's of the same kind,
// namespace and name, each Namespace, Pod and Node of upper is merged into
// lower's as kubectl apply would, and the rest of upper is added. Objects
// upper could not decode (its Dropped list) replace lower's too, so the
// result still refuses to judge traffic. Neither argument is changed.
func Overlay(lower, upper *manifest.Result) *manifest.Result {
	replaced := map[string]bool{}
	for _, r := range Refs(&upper.Cluster) {
		replaced[r.String()] = true
	}
	for _, d := range upper.Dropped {
		replaced[d] = true
	}
	out := without(lower, replaced)
	c, lc, uc := &out.Cluster, &lower.Cluster, &upper.Cluster
	var kept []policy.Diagnostic
	namespaces := map[string]*policy.Namespace{}
	for i := range lc.Namespaces {
		namespaces[lc.Namespaces[i].Name] = &lc.Namespaces[i]
	}
	for _, n := range uc.Namespaces {
		if l, ok := namespaces[n.Name]; ok {
			var d *policy.Diagnostic
			r := Ref{Kind: "Namespace", Name: n.Name}
			n.Labels, d = applyLabels(r, l.Labels, n.Labels, lower.LastApplied[r.String()])
			kept = appendDiag(kept, d)
		}
		c.Namespaces = append(c.Namespaces, n)
	}
	nodes := map[string]*policy.Node{}
	for i := range lc.Nodes {
		nodes[lc.Nodes[i].Name] = &lc.Nodes[i]
	}
	for _, n := range uc.Nodes {
		if l, ok := nodes[n.Name]; ok {
			var d *policy.Diagnostic
			r := Ref{Kind: "Node", Name: n.Name}
			n.Labels, d = applyLabels(r, l.Labels, n.Labels, lower.LastApplied[r.String()])
			kept = appendDiag(kept, d)
			if len(n.Addrs) == 0 {
				n.Addrs = l.Addrs
			}
			if len(n.PodCIDRs) == 0 {
				n.PodCIDRs = l.PodCIDRs
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	pods := map[string]*policy.Pod{}
	for _, p := range lc.Pods {
		pods[p.Key()] = p
	}
	for _, up := range uc.Pods {
		if l, ok := pods[up.Key()]; ok {
			p := *up
			var d *policy.Diagnostic
			r := Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name}
			p.Labels, d = applyLabels(r, l.Labels, p.Labels, lower.LastApplied[r.String()])
			kept = appendDiag(kept, d)
			if len(p.IPs) == 0 {
				p.IPs = l.IPs
			}
			if p.NodeName == "" {
				p.NodeName = l.NodeName
			}
			if len(p.Ports) == 0 {
				p.Ports = l.Ports
			}
			p.HostNetwork = p.HostNetwork || l.HostNetwork
			up = &p
		}
		c.Pods = append(c.Pods, up)
	}
	c.NetworkPolicies = append(c.NetworkPolicies, uc.NetworkPolicies...)
	c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, uc.ClusterNetworkPolicies...)
	out.Diagnostics = append(out.Diagnostics, upper.Diagnostics...)
	out.Diagnostics = append(out.Diagnostics, kept...)
	out.Dropped = append(out.Dropped, upper.Dropped...)
	out.Skipped = append(out.Skipped, upper.Skipped...)
	for r, l := range upper.LastApplied {
		if out.LastApplied == nil {
			out.LastApplied = map[string]map[string]bool{}
		}
		out.LastApplied[r] = l
	}
	return out
}

func appendDiag(ds []policy.Diagnostic, d *policy.Diagnostic) []policy.Diagnostic {
	if d == nil {
		return ds
	}
	return append(ds, *d)
}

// applyLabels is the labels of an object after apply of a manifest with
// set: set's values over live's, live's other labels kept, as apply keeps
// labels it did not set, except those the live object's
// last-applied-configuration names (applied): an earlier apply set them,
// so apply removes them. Without that annotation (applied nil), which
// labels an earlier apply set is unknown (server-side apply's managed
// fields are not read): the kept ones are named in the returned warning.
func applyLabels(r Ref, live, set map[string]string, applied map[string]bool) (map[string]string, *policy.Diagnostic) {
	var keptKeys []string
	out := make(map[string]string, len(live)+len(set))
	for k, v := range live {
		if _, ok := set[k]; ok {
			continue
		}
		if applied[k] {
			continue // set by an earlier apply, no longer: apply removes it
		}
		out[k] = v
		if k != "kubernetes.io/metadata.name" {
			keptKeys = append(keptKeys, k)
		}
	}
	for k, v := range set {
		out[k] = v
	}
	if len(keptKeys) == 0 || applied != nil {
		// Known not to be apply's: kept, as apply keeps them.
		return out, nil
	}
	slices.Sort(keptKeys)
	for i, k := range keptKeys {
		keptKeys[i] = k + "=" + live[k]
	}
	return out, &policy.Diagnostic{Severity: policy.SeverityWarning, Object: r.String(), Field: "metadata.labels",
		Message: "labels " + strings.Join(keptKeys, ", ") + " kept from the current state: the manifest does not set them and kubectl apply keeps labels it did not set, but the object has no kubectl.kubernetes.io/last-applied-configuration to tell whether an earlier apply set them (apply would remove those): check them"}
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
	}
	for _, r := range Cascade(res, refs) {
		gone[r.String()] = true
	}
	return without(res, gone), nil
}

// Cascade returns refs with what deleting them deletes too, as Kubernetes
// would: a Namespace's Pods and NetworkPolicies (the namespace
// controller), a Node's Pods (the pod garbage collector). Keeping them
// would model a state a cluster cannot reach: a namespace's pods without
// its labels, pods on no node.
func Cascade(res *manifest.Result, refs []Ref) []Ref {
	out := slices.Clone(refs)
	namespaces, nodes := map[string]bool{}, map[string]bool{}
	for _, r := range refs {
		switch r.Kind {
		case "Namespace":
			namespaces[r.Name] = true
		case "Node":
			nodes[r.Name] = true
		}
	}
	if len(namespaces) == 0 && len(nodes) == 0 {
		return out
	}
	named := map[string]bool{}
	for _, r := range refs {
		named[r.String()] = true
	}
	add := func(r Ref) {
		if !named[r.String()] {
			named[r.String()] = true
			out = append(out, r)
		}
	}
	for _, p := range res.Cluster.Pods {
		if namespaces[p.Namespace] || (p.NodeName != "" && nodes[p.NodeName]) {
			add(Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name})
		}
	}
	for _, np := range res.Cluster.NetworkPolicies {
		if namespaces[np.Namespace] {
			add(npRef(np))
		}
	}
	for _, d := range res.Dropped {
		// An object of the namespace that could not be loaded goes too.
		if kind, rest, ok := strings.Cut(d, " "); ok && (kind == "Pod" || kind == "NetworkPolicy") {
			if ns, name, ok := strings.Cut(rest, "/"); ok && namespaces[ns] {
				add(Ref{Kind: kind, Namespace: ns, Name: name})
			}
		}
	}
	return out
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
	for r, l := range res.LastApplied {
		if !gone[r] {
			if out.LastApplied == nil {
				out.LastApplied = map[string]map[string]bool{}
			}
			out.LastApplied[r] = l
		}
	}
	return out
}
