package policy_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// baseCluster is the inventory every semantics case runs against.
const baseCluster = `
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {role: worker}}
status: {addresses: [{type: InternalIP, address: 10.0.0.1}, {type: InternalIP, address: "fd00::a:1"}, {type: Hostname, address: n1}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2, labels: {role: worker, compromised: "true"}}
status: {addresses: [{type: InternalIP, address: 10.0.0.2}]}
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
metadata: {name: x, namespace: a, labels: {app: x}}
spec:
  nodeName: n1
  containers: [{name: c, ports: [{name: http, containerPort: 80}, {name: dns, containerPort: 53, protocol: UDP}]}]
status: {podIPs: [{ip: 10.1.1.1}, {ip: "fd00::1:1"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: "y", namespace: a, labels: {app: "y"}}
spec:
  nodeName: n2
  containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]
status: {podIP: 10.1.2.1}
---
apiVersion: v1
kind: Pod
metadata: {name: z, namespace: b, labels: {app: z}}
spec:
  nodeName: n1
  containers: [{name: c, ports: [{name: web, containerPort: 80}]}]
status: {podIPs: [{ip: 10.1.1.2}, {ip: "fd00::1:2"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: h, namespace: kube-system, labels: {app: h}}
spec:
  nodeName: n1
  hostNetwork: true
  containers: [{name: c, ports: [{name: m, containerPort: 9100}]}]
status: {podIP: 10.0.0.1}
`

type flowCase struct {
	name      string
	from, to  string
	port      uint16
	proto     string
	allowed   bool
	egress    policy.Tier // "" = don't check
	ingress   policy.Tier
	reasonHas string
}

func compile(t *testing.T, policies string, opts policy.Options) *policy.Program {
	t.Helper()
	return policy.Compile(load(t, policies), opts)
}

// load reads the base cluster and policies.
func load(t *testing.T, policies string) *policy.Cluster {
	t.Helper()
	return loadAlone(t, baseCluster+"\n---\n"+policies)
}

func runFlows(t *testing.T, prog *policy.Program, cases []flowCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			proto := "TCP"
			if c.proto != "" {
				proto = c.proto
			}
			f := judgeFlow(t, prog, c.from, c.to, c.port, proto)
			if f.Allowed != c.allowed {
				t.Errorf("allowed = %v, want %v\negress: %+v\ningress: %+v", f.Allowed, c.allowed, f.Egress, f.Ingress)
			}
			if c.egress != "" && f.Egress.Tier != c.egress {
				t.Errorf("egress tier = %s, want %s (%s)", f.Egress.Tier, c.egress, f.Egress.Reason)
			}
			if c.ingress != "" && f.Ingress.Tier != c.ingress {
				t.Errorf("ingress tier = %s, want %s (%s)", f.Ingress.Tier, c.ingress, f.Ingress.Reason)
			}
			if c.reasonHas != "" && !strings.Contains(f.Egress.Reason+" | "+f.Ingress.Reason, c.reasonHas) {
				t.Errorf("reasons %q | %q lack %q", f.Egress.Reason, f.Ingress.Reason, c.reasonHas)
			}
		})
	}
}

func judge(t *testing.T, prog *policy.Program, from, to string, port uint16, proto string) bool {
	t.Helper()
	return judgeFlow(t, prog, from, to, port, proto).Allowed
}

// endpoints parses a flow's ends named as on the command line
// (namespace/pod or IP).
func endpoints(t *testing.T, prog *policy.Program, from, to string) (src, dst policy.Endpoint) {
	t.Helper()
	src, err := prog.ParseEndpoint(from)
	if err != nil {
		t.Fatal(err)
	}
	dst, err = prog.ParseEndpoint(to)
	if err != nil {
		t.Fatal(err)
	}
	return src, dst
}

// judgeFlow evaluates one flow between endpoints named as on the command
// line (namespace/pod or IP).
func judgeFlow(t *testing.T, prog *policy.Program, from, to string, port uint16, proto string) matrix.Flow {
	t.Helper()
	src, dst := endpoints(t, prog, from, to)
	pp, err := matrix.ParsePortProto(strconv.Itoa(int(port)) + "/" + proto)
	if err != nil {
		t.Fatal(err)
	}
	return matrix.Judge(prog, matrix.Endpoint{Label: from, Endpoint: src}, matrix.Endpoint{Label: to, Endpoint: dst}, pp)
}
