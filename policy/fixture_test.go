package policy_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// The fixture builder writes a test cluster's Nodes, Namespaces and Pods
// as manifests, so that a fixture states only what its test turns on
// (addresses, pod CIDRs, host network, labels) while the objects still
// reach the compiler through the loader, as a user's do.

// fixtureDoc is one object of a fixture cluster.
type fixtureDoc interface{ yaml() string }

// manifests is the fixture's objects as one YAML stream.
func manifests(docs ...fixtureDoc) string {
	var b strings.Builder
	for i, d := range docs {
		if i > 0 {
			b.WriteString("---\n")
		}
		b.WriteString(d.yaml())
	}
	return b.String()
}

// fixNode is a Node: its status lists the internal addresses, then the
// external ones.
type fixNode struct {
	name               string
	podCIDRs           []string
	internal, external []string
}

func (n fixNode) yaml() string {
	var addrs []string
	for _, a := range n.internal {
		addrs = append(addrs, fmt.Sprintf("{type: InternalIP, address: %q}", a))
	}
	for _, a := range n.external {
		addrs = append(addrs, fmt.Sprintf("{type: ExternalIP, address: %q}", a))
	}
	spec := ""
	if len(n.podCIDRs) > 0 {
		spec = fmt.Sprintf("spec: {podCIDRs: [%s]}\n", quoted(n.podCIDRs))
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: %q}\n%sstatus: {addresses: [%s]}\n", n.name, spec, strings.Join(addrs, ", "))
}

// fixNamespace is a Namespace without labels.
type fixNamespace string

func (ns fixNamespace) yaml() string {
	return fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %q}\n", string(ns))
}

// fixPod is a running Pod with one container and no ports.
type fixPod struct {
	namespace, name, node string
	labels                map[string]string
	hostNetwork           bool
	ips                   []string // status.podIP if one, status.podIPs if more
}

func (p fixPod) yaml() string {
	labels := ""
	if len(p.labels) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(p.labels)) {
			kv = append(kv, fmt.Sprintf("%q: %q", k, p.labels[k]))
		}
		labels = fmt.Sprintf(", labels: {%s}", strings.Join(kv, ", "))
	}
	host := ""
	if p.hostNetwork {
		host = "hostNetwork: true, "
	}
	status := fmt.Sprintf("podIP: %q", p.ips[0])
	if len(p.ips) > 1 {
		var ips []string
		for _, ip := range p.ips {
			ips = append(ips, fmt.Sprintf("{ip: %q}", ip))
		}
		status = fmt.Sprintf("podIPs: [%s]", strings.Join(ips, ", "))
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %q, namespace: %q%s}\nspec: {nodeName: %q, %scontainers: [{name: c}]}\nstatus: {%s}\n",
		p.name, p.namespace, labels, p.node, host, status)
}

// yamlDoc is an object written out, for what the builder does not cover.
type yamlDoc string

func (d yamlDoc) yaml() string { return strings.TrimPrefix(string(d), "\n") }

func quoted(ss []string) string {
	var q []string
	for _, s := range ss {
		q = append(q, fmt.Sprintf("%q", s))
	}
	return strings.Join(q, ", ")
}

// loadAlone reads manifests, without the semantics base cluster, and
// fails the test if the loader drops any object.
func loadAlone(t *testing.T, y string) *policy.Cluster {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(y)}).Load("-")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(res.Dropped) > 0 {
		t.Fatalf("dropped objects: %v %v", res.Dropped, res.Diagnostics)
	}
	return &res.Cluster
}

// compileWith compiles manifests without the semantics base cluster.
func compileWith(t *testing.T, y string, opts policy.Options) *policy.Program {
	t.Helper()
	return policy.Compile(loadAlone(t, y), opts)
}
