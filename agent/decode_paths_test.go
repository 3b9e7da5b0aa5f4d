package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// pathsInventory is the cluster every case of TestFilesAndInformersAgree
// judges traffic in.
const pathsInventory = `
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {pool: a}}
status: {addresses: [{type: InternalIP, address: 10.1.0.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2, labels: {pool: b}}
status: {addresses: [{type: InternalIP, address: 10.1.0.2}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {env: prod}}
---
apiVersion: v1
kind: Namespace
metadata: {name: b, labels: {env: dev}}
---
apiVersion: v1
kind: Pod
metadata: {name: x, namespace: a, labels: {app: x}, annotations: {note: ignored}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{name: http, containerPort: 80}]}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: "y", namespace: a, labels: {app: "y"}}
spec: {nodeName: n2, containers: [{name: c, ports: [{name: dns, containerPort: 53, protocol: UDP}]}]}
status: {phase: Running, podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: z, namespace: b, labels: {app: z}}
spec: {nodeName: n1, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
status: {phase: Running, podIPs: [{ip: 10.0.0.3}]}
`

// Issue 9.10: one truth for the CLI and the agent. The same bytes go
// through the file loader (moat explain, check, matrix) and through the
// agent's informer decoding (API server JSON -> unstructured map ->
// decodeNP/decodeCNP; pods, nodes and namespaces through the typed
// informers' slimming and the shared converters), and must give the same
// Program (every verdict), statuses and diagnostics, with the feature gate
// off and on.
func TestFilesAndInformersAgree(t *testing.T) {
	for _, tc := range []struct{ name, policies string }{
		{"valid policies", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: a}
spec: {podSelector: {matchLabels: {app: x}}, ingress: [{from: [{podSelector: {}}], ports: [{port: http}]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api, namespace: a}
spec: {podSelector: {matchLabels: {app: "y"}}, policyTypes: [Ingress, Egress], ingress: [{from: [{podSelector: {}}, {podSelector: {matchLabels: {app: x}}, namespaceSelector: {}}], ports: [{protocol: TCP, port: 80}]}], egress: [{to: [{podSelector: {matchLabels: {app: x}}}], ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 53}]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: b}
spec: {podSelector: {}, policyTypes: [Ingress, Egress], ingress: [{from: [{podSelector: {matchLabels: {app: x}}, namespaceSelector: {}}], ports: [{protocol: TCP, port: 80}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin}
spec: {tier: Admin, priority: 3, subject: {namespaces: {matchLabels: {env: dev}}}, egress: [{action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: "y"}}}}], protocols: [{udp: {destinationPort: {number: 53}}}]}]}
status: {conditions: [{type: Accepted, status: "True", reason: Accepted, message: ok, lastTransitionTime: "2024-01-01T00:00:00Z", observedGeneration: 1}]}`},
		{"unknown fields", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: a}
spec: {podSelector: {}, ingress: [{from: [{serviceAccount: {name: s}}, {podSelector: {matchLabels: {app: "y"}}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec: {tier: Baseline, priority: 3, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{fqdn: x}]}], egress: [{action: Accept, to: [{namespaces: {}}], protocols: [{icmp: {}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: misindented}
spec: {tier: Admin, priority: 4, subject: {namespaces: {matchLabels: {env: dev}}}}
ingress: [{action: Accept, from: [{namespaces: {}}]}]`},
		{"wrongly typed NetworkPolicy rules", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ports, namespace: a}
spec: {podSelector: {matchLabels: {app: x}}, ingress: [{ports: "80"}, {from: [{podSelector: {}}], ports: [{port: 80}]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from, namespace: b}
spec: {podSelector: {}, policyTypes: [Egress], egress: [{to: {podSelector: {}}}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: list, namespace: a}
spec: {podSelector: {matchLabels: {app: "y"}}, egress: "all"}`},
		{"wrongly typed NetworkPolicy spec", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sel, namespace: a}
spec: {podSelector: "app=x", ingress: [{}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: spec, namespace: b}
spec: 42
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: types, namespace: a}
spec: {podSelector: {}, policyTypes: Ingress}`},
		{"wrongly typed ClusterNetworkPolicies", `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: priority}
spec: {tier: Admin, priority: high, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: rule}
spec: {tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: "80"}}}]}, {action: Pass, from: [{namespaces: {}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: subject}
spec: {tier: Baseline, priority: 5, subject: [a], egress: [{action: Deny, to: [{networks: [10.0.0.3/32]}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: spec}
spec: "Deny everything"
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: egress}
spec: {tier: Baseline, priority: 9, subject: {namespaces: {}}, egress: {action: Deny}}`},
		{"missing required fields", `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: nopriority}
spec: {tier: Admin, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: nopodselector}
spec: {tier: Admin, priority: 1, subject: {pods: {namespaceSelector: {matchLabels: {env: dev}}}}, egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 70}}}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: nospec}`},
		{"NPEP-127 ingress peers", `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: ingress-peers}
spec: {tier: Admin, priority: 2, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{nodes: {matchLabels: {pool: a}}}]}, {action: Deny, from: [{networks: [10.0.0.0/30]}]}]}`},
	} {
		for _, gate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gate=%v", tc.name, gate), func(t *testing.T) {
				opts := policy.Options{IngressNetworksAndNodes: gate}
				docs := pathsInventory + "\n---\n" + tc.policies
				file := loadFile(t, docs)
				api := viaInformers(t, docs)
				fileProg, apiProg := policy.Compile(file, opts), policy.Compile(api, opts)
				if diff := cmp.Diff(fileProg.Status, apiProg.Status); diff != "" {
					t.Errorf("statuses differ (-file +informers):\n%s", diff)
				}
				if diff := cmp.Diff(diagnostics(fileProg), diagnostics(apiProg)); diff != "" {
					t.Errorf("diagnostics differ (-file +informers):\n%s", diff)
				}
				if diff := cmp.Diff(verdicts(fileProg), verdicts(apiProg)); diff != "" {
					t.Errorf("verdicts differ (-file +informers):\n%s", diff)
				}
				if len(fileProg.Status) == 0 {
					t.Error("no policy compiled")
				}
			})
		}
	}
}

func loadFile(t *testing.T, docs string) *policy.Cluster {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(docs)}).Load("-")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) > 0 {
		t.Fatalf("file loader dropped %v: %v", res.Dropped, res.Diagnostics)
	}
	return &res.Cluster
}

// viaInformers builds the Cluster as the agent does from what the API
// server would send: JSON decoded into unstructured maps for policies
// (dynamic informers), into typed objects for the rest, with what equal
// objects repeat shared as the informers' transforms share it.
func viaInformers(t *testing.T, docs string) *policy.Cluster {
	t.Helper()
	var c policy.Cluster
	shared := newLabelSets()
	for _, doc := range strings.Split(docs, "\n---\n") {
		js, err := sigsyaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var head struct{ Kind string }
		if err := json.Unmarshal(js, &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "Pod":
			var p corev1.Pod
			decodeTyped(t, js, &p)
			cached, _ := shared.toCachedPod(&p, nil)
			c.Pods = append(c.Pods, &cached.(*cachedPod).Pod)
		case "Node":
			var n corev1.Node
			decodeTyped(t, js, &n)
			cached, _ := toCachedNode(&n)
			c.Nodes = append(c.Nodes, cached.(*cachedNode).Node)
		case "Namespace":
			var n corev1.Namespace
			decodeTyped(t, js, &n)
			cached, _ := toCachedNamespace(&n)
			c.Namespaces = append(c.Namespaces, cached.(*cachedNamespace).Namespace)
		case "NetworkPolicy":
			c.NetworkPolicies = append(c.NetworkPolicies, &shared.decodeNP(unstructuredJSON(t, js)).NetworkPolicy)
		case "ClusterNetworkPolicy":
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, shared.decodeCNP(unstructuredJSON(t, js)).ClusterNetworkPolicy)
		default:
			t.Fatalf("unexpected kind %q", head.Kind)
		}
	}
	return &c
}

func decodeTyped(t *testing.T, js []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(js, into); err != nil {
		t.Fatal(err)
	}
}

// unstructuredJSON decodes as client-go's dynamic client does.
func unstructuredJSON(t *testing.T, js []byte) *unstructured.Unstructured {
	t.Helper()
	obj, _, err := unstructured.UnstructuredJSONScheme.Decode(js, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		t.Fatalf("decoded %T", obj)
	}
	var _ runtime.Object = u
	return u
}

// diagnostics are the compiler's findings without their source (a file
// name or "api").
func diagnostics(p *policy.Program) []string {
	var out []string
	for _, d := range p.Diagnostics {
		d.Source = ""
		out = append(out, d.String())
	}
	slices.Sort(out)
	return out
}

// verdicts judges every ordered pair of pods and nodes on a few ports.
func verdicts(p *policy.Program) []string {
	var eps []policy.Endpoint
	for i := range p.Pods {
		if len(p.Pods[i].IPs) > 0 {
			eps = append(eps, policy.Endpoint{Pod: i, Addr: p.Pods[i].IPs[0]})
		}
	}
	for _, n := range p.Nodes {
		eps = append(eps, policy.Endpoint{Pod: -1, Addr: n.Addrs[0]})
	}
	var out []string
	var b bytes.Buffer
	for _, s := range eps {
		for _, d := range eps {
			for _, pp := range []struct {
				proto policy.Protocol
				port  uint16
			}{{policy.ProtoTCP, 80}, {policy.ProtoUDP, 53}, {policy.ProtoTCP, 8080}} {
				v := p.Evaluate(policy.Flow{Src: s, Dst: d, Proto: pp.proto, Port: pp.port})
				b.Reset()
				fmt.Fprintf(&b, "%s->%s %d/%d: %v | %s | %s", s.Addr, d.Addr, pp.port, pp.proto, v.Allowed, v.Egress.Reason, v.Ingress.Reason)
				out = append(out, b.String())
			}
		}
	}
	return out
}
