package matrix

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

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
