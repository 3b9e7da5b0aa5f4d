package policy_test

import (
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// diagnosticsFor loads one document and returns "field: message" lines of
// every error.
func diagnosticsFor(t *testing.T, doc string) []string {
	t.Helper()
	l := manifest.Loader{Stdin: strings.NewReader(doc)}
	res, err := l.Load("-")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	prog := policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: true})
	var out []string
	for _, d := range append(res.Diagnostics, prog.Diagnostics...) {
		if d.Severity == policy.SeverityError {
			out = append(out, d.Object+": "+d.Field+": "+d.Message)
		}
	}
	return out
}

func TestValidation(t *testing.T) {
	const np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\n"
	const cnp = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\n"
	cases := []struct {
		name string
		doc  string
		want []string // substrings, each must appear in some error; nil = valid
	}{
		{"valid NetworkPolicy with endPort", np + "spec: {podSelector: {}, ingress: [{ports: [{port: 1000, endPort: 2000}]}]}", nil},
		{"endPort < port", np + "spec: {podSelector: {}, ingress: [{ports: [{port: 100}, {port: 1000, endPort: 999}]}]}",
			[]string{"NetworkPolicy ns1/p: spec.ingress[0].ports[1].endPort: Invalid value: 999: must be greater than or equal to `port`"}},
		{"endPort without port", np + "spec: {podSelector: {}, egress: [{ports: [{endPort: 80}]}]}",
			[]string{"spec.egress[0].ports[0].port: Required value"}},
		{"endPort with named port", np + "spec: {podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}",
			[]string{"spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric"}},
		{"endPort out of range", np + "spec: {podSelector: {}, ingress: [{ports: [{port: 80, endPort: 70000}]}]}",
			[]string{"spec.ingress[0].ports[0].endPort: Invalid value: 70000: must be between 1 and 65535"}},
		{"port 0", np + "spec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}", []string{"spec.ingress[0].ports[0].port"}},
		{"bad protocol", np + "spec: {podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}", []string{`spec.ingress[0].ports[0].protocol: Unsupported value: "ICMP"`}},
		{"bad port name", np + "spec: {podSelector: {}, ingress: [{ports: [{port: Not_A_Name}]}]}", []string{"spec.ingress[0].ports[0].port"}},
		{"bad CIDR", np + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}", []string{"spec.ingress[0].from[0].ipBlock.cidr"}},
		{"except outside cidr", np + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}", []string{"spec.ingress[0].from[0].ipBlock.except[0]"}},
		{"ipBlock with selector", np + "spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}", []string{"spec.ingress[0].from[0]: Forbidden"}},
		{"empty peer", np + "spec: {podSelector: {}, ingress: [{from: [{}]}]}", []string{"spec.ingress[0].from[0]: Required value: must specify a peer"}},
		{"bad selector operator", np + "spec: {podSelector: {matchExpressions: [{key: a, operator: Like, values: [b]}]}}", []string{"spec.podSelector.matchExpressions[0].operator"}},
		{"bad policyType", np + "spec: {podSelector: {}, policyTypes: [Sideways]}", []string{"spec.policyTypes[0]"}},
		{"unknown field", np + "spec: {podSelector: {}, ingress: [{ports: [{port: 80, flags: [syn]}]}]}", []string{"spec.ingress[0].ports[0].flags: unknown field"}},
		{"missing namespace defaults", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}", nil},

		{"valid ClusterNetworkPolicy", cnp + `spec: {tier: Admin, priority: 0, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{networks: ["10.0.0.0/8"]}, {nodes: {}}], protocols: [{tcp: {destinationPort: {range: {start: 1, end: 2}}}}]}]}`, nil},
		{"tier", cnp + "spec: {tier: Middle, priority: 1, subject: {namespaces: {}}}", []string{`spec.tier: Unsupported value: "Middle"`}},
		{"priority", cnp + "spec: {tier: Admin, priority: 1001, subject: {namespaces: {}}}", []string{"spec.priority: Invalid value: 1001: must be between 0 and 1000"}},
		{"subject one-of", cnp + "spec: {tier: Admin, priority: 1, subject: {namespaces: {}, pods: {namespaceSelector: {}, podSelector: {}}}}", []string{"spec.subject: Forbidden: exactly one of namespaces, pods must be set, found 2"}},
		{"empty subject", cnp + "spec: {tier: Admin, priority: 1, subject: {}}", []string{"spec.subject: Required value"}},
		{"too many rules", cnp + "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [" + strings.Repeat("{action: Deny, to: [{nodes: {}}]},", 26) + "]}", []string{"spec.egress: Too many: 26: must have at most 25 items"}},
		{"no peers", cnp + "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: []}]}", []string{"spec.ingress[0].from: Required value"}},
		{"action", cnp + "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Allow, from: [{namespaces: {}}]}]}", []string{`spec.ingress[0].action: Unsupported value: "Allow"`}},
		{"rule name length", cnp + "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{name: " + strings.Repeat("n", 101) + ", action: Deny, from: [{namespaces: {}}]}]}", []string{"spec.ingress[0].name: Too long"}},
		{"peer one-of", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{namespaces: {}, networks: ["1.2.3.4/32"]}]}]}`, []string{"spec.egress[0].to[0]: Forbidden: exactly one of namespaces, pods, nodes, networks, domainNames must be set, found 2"}},
		{"bad network", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{networks: ["1.2.3.4/40"]}]}]}`, []string{"spec.egress[0].to[0].networks[0]: Invalid value: \"1.2.3.4/40\": Invalid CIDR format provided"}},
		{"too many networks", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{networks: [` + strings.TrimSuffix(strings.Repeat(`"10.0.0.0/8",`, 26), ",") + `]}]}]}`, []string{"spec.ingress[0].from[0].networks: Invalid value: 26: must have between 1 and 25 items"}},
		{"protocol one-of", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 1}}, udp: {destinationPort: {number: 1}}}]}]}`, []string{"spec.ingress[0].protocols[0]: Forbidden: exactly one of"}},
		{"empty protocols", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: []}]}`, []string{"spec.ingress[0].protocols: Invalid value: 0"}},
		{"port one-of", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 5, range: {start: 1, end: 9}}}}]}]}`, []string{"spec.ingress[0].protocols[0].tcp.destinationPort: Forbidden: exactly one of number, range must be set, found 2"}},
		{"range start < end", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {range: {start: 9, end: 9}}}}]}]}`, []string{"spec.ingress[0].protocols[0].udp.destinationPort.range: Invalid value: \"9-9\": Start port must be less than End port"}},
		{"port number range", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{sctp: {destinationPort: {number: 65536}}}]}]}`, []string{"spec.ingress[0].protocols[0].sctp.destinationPort.number"}},
		{"named port with networks (egress)", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Accept, to: [{networks: ["10.0.0.0/8"]}], protocols: [{destinationNamedPort: http}]}]}`, []string{"spec.egress[0].protocols[0].destinationNamedPort: Invalid value: \"http\": networks/nodes/domainNames peer cannot be set with namedPorts"}},
		{"named port with nodes (ingress, NPEP-127)", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{nodes: {}}], protocols: [{destinationNamedPort: http}]}]}`, []string{"spec.ingress[0].protocols[0].destinationNamedPort"}},
		{"unknown protocol field", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{icmp: {}}]}]}`, []string{"spec.ingress[0].protocols[0].icmp: unknown field", "spec.ingress[0].protocols[0]: Required value"}},
		{"every violation listed", cnp + `spec: {tier: X, priority: -1, subject: {}}`, []string{"spec.tier", "spec.priority", "spec.subject"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := diagnosticsFor(t, c.doc)
			if c.want == nil {
				if len(got) > 0 {
					t.Fatalf("want valid, got %q", got)
				}
				return
			}
			for _, w := range c.want {
				found := false
				for _, g := range got {
					if strings.Contains(g, w) {
						found = true
					}
				}
				if !found {
					t.Errorf("no error contains %q; got:\n  %s", w, strings.Join(got, "\n  "))
				}
			}
		})
	}
}

// Exactly the errors an operator needs, each naming the field that is
// wrong and why: a value of the wrong JSON type is not followed by what
// validation says of the empty value decoding left (a one-of it emptied),
// and an IPv4 address with a leading zero in an octet (which some parsers
// read as octal, the API server's legacy parser as decimal) is refused
// with that reason, never read with another meaning.
func TestErrorsNameTheField(t *testing.T) {
	const np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\n"
	const cnp = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\n"
	const cnpSpec = "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, "
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"peer member of the wrong type", cnp + cnpSpec + `egress: [{action: Deny, to: [{networks: 5}]}]}`,
			[]string{"ClusterNetworkPolicy c: spec.egress[0].to[0].networks: Invalid value: must be a list, found a number"}},
		{"subject member of the wrong type", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: []}}`,
			[]string{"ClusterNetworkPolicy c: spec.subject.namespaces: Invalid value: must be an object, found a list"}},
		{"NetworkPolicy peer member of the wrong type", np + `spec: {podSelector: {}, ingress: [{from: [{podSelector: "app=x"}]}]}`,
			[]string{"NetworkPolicy ns1/p: spec.ingress[0].from[0].podSelector: Invalid value: must be an object, found a string"}},
		{"leading zero in the first octet", np + `spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: "010.0.0.0/8"}}]}]}`,
			[]string{`NetworkPolicy ns1/p: spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "010.0.0.0/8": invalid CIDR "010.0.0.0/8": IPv4 field has octet with leading zero`}},
		{"leading zero in the last octet", np + `spec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: "10.0.0.01/32"}}]}]}`,
			[]string{`NetworkPolicy ns1/p: spec.egress[0].to[0].ipBlock.cidr: Invalid value: "10.0.0.01/32": invalid CIDR "10.0.0.01/32": IPv4 field has octet with leading zero`}},
		{"leading zero in an except", np + `spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: ["10.01.0.0/16"]}}]}]}`,
			[]string{`NetworkPolicy ns1/p: spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "10.01.0.0/16": invalid CIDR "10.01.0.0/16": IPv4 field has octet with leading zero`}},
		{"leading zero in a prefix length", np + `spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: "10.0.0.0/08"}}]}]}`,
			[]string{`NetworkPolicy ns1/p: spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "10.0.0.0/08": invalid CIDR "10.0.0.0/08": prefix length with a leading zero`}},
		{"leading zero in networks", cnp + cnpSpec + `egress: [{action: Deny, to: [{networks: ["010.0.0.0/8"]}]}]}`,
			[]string{`ClusterNetworkPolicy c: spec.egress[0].to[0].networks[0]: Invalid value: "010.0.0.0/8": Invalid CIDR format provided: IPv4 field has octet with leading zero`}},
		{"IPv4-mapped IPv6 in networks", cnp + cnpSpec + `egress: [{action: Deny, to: [{networks: ["::ffff:10.0.0.0/104"]}]}]}`,
			[]string{`ClusterNetworkPolicy c: spec.egress[0].to[0].networks[0]: Invalid value: "::ffff:10.0.0.0/104": Invalid CIDR format provided: an IPv4-mapped IPv6 address`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := diagnosticsFor(t, tc.doc); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}
