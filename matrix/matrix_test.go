package matrix

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/policy"
)

func TestParsePortProto(t *testing.T) {
	cases := []struct {
		in      string
		want    PortProto
		wantErr string
	}{
		{in: "80", want: PortProto{80, policy.ProtoTCP}},
		{in: "53/udp", want: PortProto{53, policy.ProtoUDP}},
		{in: "9/SCTP", want: PortProto{9, policy.ProtoSCTP}},
		{in: "0", wantErr: "between 1 and 65535"},
		{in: "65536/TCP", wantErr: "between 1 and 65535"},
		{in: "80/ICMP", wantErr: "TCP, UDP or SCTP"},
		{in: "http", wantErr: "must be a number"},
	}
	for _, c := range cases {
		got, err := ParsePortProto(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: err %v, want %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

// Two pods and a peer without policies: every ordered pair, self
// included, on the one declared port, all allowed, in the compact table.
func TestBuildAndTable(t *testing.T) {
	c := &policy.Cluster{
		Pods: []*policy.Pod{
			{Namespace: "n", Name: "a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ports: []policy.ContainerPort{{Port: 80, Protocol: policy.ProtoTCP}}},
			{Namespace: "n", Name: "b", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Labels: map[string]string{"app": "b"}},
		},
	}
	prog := policy.Compile(c, policy.Options{})
	// No policies: all allowed; one port from the container ports; pairs incl. self and peer.
	res, err := Build(prog, Options{Peers: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Flows) != 9 || len(res.Ports) != 1 || res.Ports[0] != (PortProto{80, policy.ProtoTCP}) {
		t.Fatalf("flows %d ports %v", len(res.Flows), res.Ports)
	}
	for _, f := range res.Flows {
		if !f.Allowed {
			t.Errorf("%s -> %s denied without policies", f.From, f.To)
		}
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	want := "80/TCP   (rows: from, columns: to; . allowed, X denied)\n" +
		"             1 2 3\n" +
		"1 n/a        . . .\n" +
		"2 n/b        . . .\n" +
		"3 192.0.2.1  . . .\n"
	if buf.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", buf.String(), want)
	}
	if _, err := Build(policy.Compile(&policy.Cluster{}, policy.Options{}), Options{}); err == nil {
		t.Error("no ports and no --port: want an error")
	}
}

// TestDualStackMixedCells: a pair whose families get different verdicts is
// a mixed cell, with the other family's flow in the JSON and "~" in the
// table; a pair whose families agree carries nothing more.
func TestDualStackMixedCells(t *testing.T) {
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	c := &policy.Cluster{
		Namespaces: []policy.Namespace{{Name: "n"}},
		Pods: []*policy.Pod{
			{Namespace: "n", Name: "db", IPs: ips("10.0.0.1", "fd00::1"), Labels: map[string]string{"app": "db"}, Ports: []policy.ContainerPort{{Port: 5432, Protocol: policy.ProtoTCP}}},
			{Namespace: "n", Name: "cli", IPs: ips("10.0.0.2", "fd00::2")},
		},
		// The db admits any IPv6 address and no IPv4 one.
		NetworkPolicies: []*policy.NetworkPolicy{{Namespace: "n", Name: "db", Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "::/0"}}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		}}},
	}
	res, err := Build(policy.Compile(c, policy.Options{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Flows {
		mixed := f.From == "n/cli" && f.To == "n/db"
		if f.Mixed() != mixed {
			t.Errorf("%s -> %s: mixed %v, want %v", f.From, f.To, f.Mixed(), mixed)
		}
		if mixed && (f.Allowed || !f.OtherFamilies[0].Allowed || f.OtherFamilies[0].From != "fd00::2") {
			t.Errorf("%s -> %s: allowed %v, other families %+v", f.From, f.To, f.Allowed, f.OtherFamilies)
		}
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "1 n/cli  . ~") || !strings.Contains(buf.String(), "~ allowed over one address family only") {
		t.Errorf("table has no mixed cell:\n%s", buf.String())
	}
}
