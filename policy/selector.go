package policy

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// selectorCache converts API label selectors once per distinct selector.
type selectorCache map[string]labels.Selector

// get converts sel; ok is false when the selector is invalid, and callers
// must then fail closed.
func (c selectorCache) get(sel *metav1.LabelSelector) (labels.Selector, bool) {
	if sel == nil {
		return labels.Nothing(), true
	}
	key := sel.String()
	if s, hit := c[key]; hit {
		return s, s != nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		c[key] = nil
		return nil, false
	}
	c[key] = s
	return s, true
}

// selectorKey identifies a selector for memoisation.
func selectorKey(sel *metav1.LabelSelector) string {
	if sel == nil {
		return "<nil>"
	}
	return sel.String()
}

// namespacesMatching lists the namespaces a selector selects.
func (k *compiler) namespacesMatching(sel labels.Selector) []string {
	var out []string
	for _, ns := range k.nsNames {
		if sel.Matches(labels.Set(k.nsLabels[ns])) {
			out = append(out, ns)
		}
	}
	return out
}

// peerDef is what a memoised selector peer selects: pods of the namespace
// ns (when nsSel is nil) or of the namespaces nsSel selects, that podSel
// selects. The incremental compiler re-checks single pods against it.
type peerDef struct {
	ns     string
	nsSel  labels.Selector
	podSel labels.Selector
}

func (d *peerDef) selects(k *compiler, pod *Pod) bool {
	if d.nsSel == nil {
		if pod.Namespace != d.ns {
			return false
		}
	} else if !d.nsSel.Matches(labels.Set(k.nsLabels[pod.Namespace])) {
		return false
	}
	return d.podSel.Matches(labels.Set(pod.Labels))
}

// podPeer resolves a selector peer: the pod-network pods that def selects
// and their addresses. The result is memoised by key, since many policies
// repeat the same selectors, and the key lets the incremental compiler find
// what a pod's relabel changes.
func (k *compiler) podPeer(key string, def peerDef) peer {
	if p, hit := k.peerCache[key]; hit {
		return p
	}
	var namespaces []string
	if def.nsSel == nil {
		namespaces = []string{def.ns}
	} else {
		namespaces = k.namespacesMatching(def.nsSel)
	}
	var pods []int
	for _, ns := range namespaces {
		for _, i := range k.podsByNS[ns] {
			if def.podSel.Matches(labels.Set(k.prog.Pods[i].Labels)) {
				pods = append(pods, i)
			}
		}
	}
	slices.Sort(pods)
	p := peer{addrs: k.podAddrs(pods), pods: pods, key: key}
	k.peerCache[key] = p
	k.peerDefs[key] = &def
	return p
}

// podAddrs is the set of addresses of the given pods.
func (k *compiler) podAddrs(pods []int) *AddrSet {
	var addrs []AddrRange
	for _, i := range pods {
		for _, a := range k.prog.Pods[i].IPs {
			addrs = append(addrs, AddrRange{a, a})
		}
	}
	return NewAddrSet(addrs...)
}

// nodeAddrs is the set of addresses of the nodes a selector selects.
func (k *compiler) nodeAddrs(sel labels.Selector) *AddrSet {
	var addrs []AddrRange
	for _, n := range k.prog.Nodes {
		if sel.Matches(labels.Set(n.Labels)) {
			for _, a := range n.Addrs {
				addrs = append(addrs, AddrRange{a, a})
			}
		}
	}
	return NewAddrSet(addrs...)
}

// peer is a resolved peer: the addresses it covers and, for selector
// peers, the pods behind them (where named ports resolve).
type peer struct {
	addrs *AddrSet
	pods  []int
	// key names a memoised selector peer; empty for address peers, which
	// no pod change can alter.
	key string
	// allPods: named ports resolve on every pod-network pod (the
	// "all peers" of an empty NetworkPolicy from/to list).
	allPods bool
}

// peerSet is the union of a rule's peers.
type peerSet struct {
	addrs *AddrSet
	// cidrs is the part of addrs that comes from address peers (ipBlock,
	// networks, nodes, "all"); the rest are the addresses of pods.
	cidrs   *AddrSet
	pods    []int
	allPods bool
}

// allPeers is every address: the peers of an empty from/to list, or of a
// rule failed closed.
func allPeers() peerSet {
	return peerSet{addrs: AllAddrs(), cidrs: AllAddrs(), allPods: true}
}

func unionPeers(ps []peer) peerSet {
	if len(ps) == 1 {
		out := peerSet{addrs: ps[0].addrs, pods: ps[0].pods, allPods: ps[0].allPods, cidrs: NewAddrSet()}
		if ps[0].key == "" {
			out.cidrs = ps[0].addrs
		}
		return out
	}
	var out peerSet
	var ranges, cidrs []AddrRange
	seen := map[int]bool{}
	for _, p := range ps {
		ranges = append(ranges, p.addrs.Ranges()...)
		if p.key == "" {
			cidrs = append(cidrs, p.addrs.Ranges()...)
		}
		out.allPods = out.allPods || p.allPods
		for _, i := range p.pods {
			if !seen[i] {
				seen[i] = true
				out.pods = append(out.pods, i)
			}
		}
	}
	out.addrs = NewAddrSet(ranges...)
	out.cidrs = NewAddrSet(cidrs...)
	return out
}
