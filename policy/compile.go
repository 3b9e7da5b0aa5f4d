package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// nsNameLabel is the label the API server puts on every namespace; selectors
// rely on it, so the compiler adds it even for namespaces it only knows by
// name.
const nsNameLabel = "kubernetes.io/metadata.name"

// compiler holds the indexes of one compilation. It lives only for one
// Compile call.
type compiler struct {
	prog *Program
	// nsLabels are namespace labels by name, including namespaces that
	// only pods mention.
	nsLabels map[string]map[string]string
	nsNames  []string
	// podsByNS lists pod-network pods with IPs, by namespace.
	podsByNS map[string][]int
	// policed lists the pods that get a PodPolicy.
	policed []int
	nps     []*npCompiled
	cnps    []*cnpCompiled
	sel     selectorCache
	// peerCache memoises resolved selector peers (and subjects) by a key
	// naming their selectors; peerDefs keeps the selectors themselves.
	peerCache map[string]peer
	peerDefs  map[string]*peerDef
	// Per pod, the policies that select it (indices into cnps and nps),
	// in evaluation order; kept for incremental updates.
	admin, baseline, npsOf [][]int
	cnpOrder, npOrder      []int
	dirCache               map[string]*DirPolicy
	// dirKeys lists, per policy ("a3", "n7"), the dirCache keys built from
	// it, so that a change to the policy can drop exactly those.
	dirKeys map[string][]string
	memo    map[*Rule]Match
	// isPoliced marks the pods that get a PodPolicy.
	isPoliced []bool
}

// Compile turns a snapshot into a Program. It never fails: objects that do
// not validate, or that carry fields Moat does not know, are compiled fail
// closed and reported in Program.Status and Program.Diagnostics.
func Compile(c *Cluster, opts Options) *Program {
	return newCompiler(c, opts).prog
}

func newCompiler(c *Cluster, opts Options) *compiler {
	k := &compiler{
		prog:      &Program{Options: opts},
		nsLabels:  map[string]map[string]string{},
		podsByNS:  map[string][]int{},
		peerCache: map[string]peer{},
		peerDefs:  map[string]*peerDef{},
		sel:       selectorCache{},
	}
	k.indexNamespaces(c)
	k.indexNodes(c)
	k.indexPods(c)
	k.numberPods()
	for i := range c.NetworkPolicies {
		k.nps = append(k.nps, k.compileNP(&c.NetworkPolicies[i]))
	}
	for i := range c.ClusterNetworkPolicies {
		k.cnps = append(k.cnps, k.compileCNP(&c.ClusterNetworkPolicies[i]))
	}
	k.assemble()
	k.finishStatus()
	return k
}

func (k *compiler) diag(sev Severity, object, fieldPath, source, msg string) {
	k.prog.Diagnostics = append(k.prog.Diagnostics, Diagnostic{Severity: sev, Object: object, Field: fieldPath, Message: msg, Source: source})
}

func (k *compiler) indexNamespaces(c *Cluster) {
	for _, ns := range c.Namespaces {
		if _, dup := k.nsLabels[ns.Name]; dup {
			k.diag(SeverityWarning, "Namespace "+ns.Name, "", "", "duplicate object: the first one is used")
			continue
		}
		k.nsLabels[ns.Name] = withNSName(ns.Labels, ns.Name)
	}
	for _, p := range c.Pods {
		if _, ok := k.nsLabels[p.Namespace]; !ok {
			k.nsLabels[p.Namespace] = withNSName(nil, p.Namespace)
			if !p.HostNetwork {
				k.diag(SeverityWarning, "Namespace "+p.Namespace, "", "", "no Namespace object in the input: only its kubernetes.io/metadata.name label is known to selectors")
			}
		}
	}
	for name := range k.nsLabels {
		k.nsNames = append(k.nsNames, name)
	}
	sort.Strings(k.nsNames)
}

func withNSName(l map[string]string, name string) map[string]string {
	out := make(map[string]string, len(l)+1)
	for k, v := range l {
		out[k] = v
	}
	out[nsNameLabel] = name
	return out
}

func (k *compiler) indexNodes(c *Cluster) {
	p := k.prog
	p.nodeIndex = map[string]int{}
	p.nodeByIP = map[netip.Addr]int{}
	nodes := append([]Node(nil), c.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, n := range nodes {
		if _, dup := p.nodeIndex[n.Name]; dup {
			k.diag(SeverityWarning, "Node "+n.Name, "", "", "duplicate object: the first one is used")
			continue
		}
		if len(n.Addrs) == 0 {
			k.diag(SeverityWarning, "Node "+n.Name, "status.addresses", "", "node has no IP address: `nodes` peers select nothing on it")
		}
		p.nodeIndex[n.Name] = len(p.Nodes)
		for _, a := range n.Addrs {
			if other, dup := p.nodeByIP[a.Unmap()]; dup {
				k.diag(SeverityWarning, "Node "+n.Name, "status.addresses", "", fmt.Sprintf("address %s also belongs to node %s", a, p.Nodes[other].Name))
				continue
			}
			p.nodeByIP[a.Unmap()] = len(p.Nodes)
		}
		p.Nodes = append(p.Nodes, n)
	}
}

func (k *compiler) indexPods(c *Cluster) {
	p := k.prog
	p.podByKey = map[string]int{}
	p.podByIP = map[netip.Addr]int{}
	p.dupAddrs = map[netip.Addr]bool{}
	owners := map[netip.Addr][]int{}
	pods := append([]Pod(nil), c.Pods...)
	sort.SliceStable(pods, func(i, j int) bool { return pods[i].Key() < pods[j].Key() })
	for _, pod := range pods {
		key := pod.Key()
		if _, dup := p.podByKey[key]; dup {
			k.diag(SeverityWarning, "Pod "+key, "", "", "duplicate object: the first one is used")
			continue
		}
		idx := len(p.Pods)
		p.podByKey[key] = idx
		pod.IPs = uniqueAddrs(pod.IPs)
		p.Pods = append(p.Pods, pod)
		if len(pod.IPs) == 0 {
			k.diag(SeverityWarning, "Pod "+key, "status.podIPs", "", "pod has no IP address: it is not policed and cannot be a peer by address")
			continue
		}
		if pod.HostNetwork {
			continue
		}
		for _, a := range p.Pods[idx].IPs {
			owners[a] = append(owners[a], idx)
		}
		k.podsByNS[pod.Namespace] = append(k.podsByNS[pod.Namespace], idx)
		k.policed = append(k.policed, idx)
	}
	for a, idx := range owners {
		if len(idx) == 1 {
			p.podByIP[a] = idx[0]
			continue
		}
		// Traffic on an address two pods claim cannot be attributed: it is
		// denied, and each pod stays policed on its other addresses.
		p.dupAddrs[a] = true
		for _, i := range idx {
			k.diag(SeverityWarning, "Pod "+p.Pods[i].Key(), "status.podIPs", "", fmt.Sprintf("address %s is claimed by %d pods: traffic from or to it is denied", a, len(idx)))
		}
	}
}

// check reports a policy's validation errors and unknown fields as
// diagnostics and returns them as paths to fail closed on, with the
// policy's status.
func (k *compiler) check(ref PolicyRef, source string, errs field.ErrorList, unknown []string) (badPaths, PolicyStatus) {
	for _, e := range errs {
		k.diag(SeverityError, ref.String(), e.Field, source, e.ErrorBody())
	}
	for _, u := range unknown {
		k.diag(SeverityError, ref.String(), u, source, k.unknownMessage(u))
	}
	status := PolicyStatus{Policy: ref, Accepted: true}
	bad := newBadPaths(errs, unknown)
	if len(bad) > 0 {
		status.Accepted = false
		status.Reason, status.Message = statusReason(errs, unknown)
	}
	return bad, status
}

// badPaths collects the field paths of an object that failed validation or
// were not understood, so compilation can fail closed on exactly the parts
// they belong to.
type badPaths []badPath

type badPath struct {
	path, msg string
}

func newBadPaths(errs field.ErrorList, unknown []string) badPaths {
	var b badPaths
	for _, e := range errs {
		b = append(b, badPath{e.Field, e.ErrorBody()})
	}
	for _, u := range unknown {
		b = append(b, badPath{u, "unknown field"})
	}
	return b
}

// under returns the first problem at or below path, "" if none.
func (b badPaths) under(path string) string {
	for _, p := range b {
		if p.path == path || strings.HasPrefix(p.path, path+".") || strings.HasPrefix(p.path, path+"[") {
			return p.path + ": " + p.msg
		}
	}
	return ""
}

// exactly returns the first problem at exactly path, "" if none.
func (b badPaths) exactly(path string) string {
	for _, p := range b {
		if p.path == path {
			return p.path + ": " + p.msg
		}
	}
	return ""
}

// numberPods gives policed pods ordinals so that pods a selector picks
// together tend to be adjacent: ordered by their namespace's labels, their
// namespace, their own labels, then name. Selector peers then become a few
// runs of ordinals in the evaluator's index.
func (k *compiler) numberPods() {
	p := k.prog
	p.ordinal = make([]int32, len(p.Pods))
	for i := range p.ordinal {
		p.ordinal[i] = -1
	}
	sig := func(l map[string]string) string {
		keys := make([]string, 0, len(l))
		for key, v := range l {
			keys = append(keys, key+"="+v)
		}
		sort.Strings(keys)
		return strings.Join(keys, ",")
	}
	type entry struct {
		pod         int
		nsSig, pSig string
	}
	nsSigs := map[string]string{}
	entries := make([]entry, 0, len(k.policed))
	for _, i := range k.policed {
		pod := &p.Pods[i]
		ns, ok := nsSigs[pod.Namespace]
		if !ok {
			ns = sig(k.nsLabels[pod.Namespace])
			nsSigs[pod.Namespace] = ns
		}
		entries = append(entries, entry{i, ns, sig(pod.Labels)})
	}
	sort.Slice(entries, func(a, b int) bool {
		x, y := entries[a], entries[b]
		if x.nsSig != y.nsSig {
			return x.nsSig < y.nsSig
		}
		if px, py := p.Pods[x.pod].Namespace, p.Pods[y.pod].Namespace; px != py {
			return px < py
		}
		if x.pSig != y.pSig {
			return x.pSig < y.pSig
		}
		return x.pod < y.pod
	})
	for n, e := range entries {
		p.ordinal[e.pod] = int32(n)
	}
}

// ordRanges turns pods into merged runs of ordinals.
func (k *compiler) ordRanges(pods []int) []ordRange {
	ords := make([]uint32, 0, len(pods))
	for _, i := range pods {
		if o := k.prog.ordinal[i]; o >= 0 {
			ords = append(ords, uint32(o))
		}
	}
	slices.Sort(ords)
	var out []ordRange
	for _, o := range ords {
		if n := len(out); n > 0 && out[n-1].to+1 >= o {
			out[n-1].to = max(out[n-1].to, o)
			continue
		}
		out = append(out, ordRange{o, o})
	}
	return out
}

// uniqueAddrs unmaps and de-duplicates a pod's addresses, keeping order.
func uniqueAddrs(in []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(in))
	for _, a := range in {
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// statusReason summarises problems for a status condition.
func statusReason(errs field.ErrorList, unknown []string) (reason, msg string) {
	if len(unknown) > 0 {
		return "UnknownField", fmt.Sprintf("unknown field %s: enforced fail-closed", strings.Join(unknown, ", "))
	}
	if len(errs) > 0 {
		return "InvalidSpec", errs[0].Error() + ": enforced fail-closed"
	}
	return "", ""
}
