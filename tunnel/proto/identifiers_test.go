package proto

import "testing"

func TestParseIdentifiers(t *testing.T) {
	id, err := ParseIdentifiers("ipv4=10.0.0.5&ipv6=2001:db8::5&host=Node1&cidr=10.1.0.0/16&default-route=true")
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{"10.0.0.5": true, "2001:db8::5": true, "node1": true, "NODE1.": true, "10.1.2.3": true, "10.2.0.1": false, "node2": false} {
		if got := id.MatchesHost(host); got != want {
			t.Errorf("matchesHost(%s) = %v", host, got)
		}
	}
	if !id.DefaultRoute {
		t.Error("default-route not parsed")
	}
	for _, bad := range []string{"ipv4=x", "cidr=10.0.0.0/40", "color=blue", "%zz"} {
		if _, err := ParseIdentifiers(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}
