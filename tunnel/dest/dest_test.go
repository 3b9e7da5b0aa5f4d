package dest

import "testing"

func TestParse(t *testing.T) {
	cases := []struct {
		in, want string
		err      bool
	}{
		{in: "localhost:6443", want: "localhost:6443"},
		{in: "LocalHost.:06443", want: "localhost:6443"},
		{in: "kubernetes.default.svc:https", want: "kubernetes.default.svc:443"},
		{in: "[2001:DB8::1]:443", want: "[2001:db8::1]:443"},
		{in: "[2001:db8:0:0:0:0:0:1]:443", want: "[2001:db8::1]:443"},
		{in: "[::ffff:127.0.0.1]:6443", want: "127.0.0.1:6443"},
		{in: "127.0.0.1:6443", want: "127.0.0.1:6443"},
		{in: "127.1:6443", want: "127.1:6443"}, // a name, never equal to 127.0.0.1
		{in: "[fe80::1%eth0]:443", err: true},
		{in: "2001:db8::1:443", err: true},
		{in: "host:0", err: true},
		{in: "host:65536", err: true},
		{in: "host:+1", err: true},
		{in: "host:smtp", err: true},
		{in: "host", err: true},
		{in: ":443", err: true},
		{in: "bad host:443", err: true},
		{in: "a..b:443", err: true},
	}
	for _, c := range cases {
		d, err := Parse(c.in)
		if c.err {
			if err == nil {
				t.Errorf("Parse(%q) = %v, want error", c.in, d)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if d.String() != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.in, d, c.want)
		}
	}
}

func TestAllowList(t *testing.T) {
	a, err := NewAllowList([]string{"LOCALHOST:6443", "[2001:db8::1]:443", "10.0.0.1:https"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		addr string
		ok   bool
		dial string
	}{
		{"localhost:6443", true, "localhost:6443"},
		{"localhost.:06443", true, "localhost:6443"},
		{"[2001:0db8::0001]:443", true, "[2001:db8::1]:443"},
		{"10.0.0.1:443", true, "10.0.0.1:443"},
		{"[::ffff:10.0.0.1]:443", true, "10.0.0.1:443"},
		{"127.0.0.1:6443", false, ""}, // not named, even though localhost may resolve to it
		{"localhost:6444", false, ""},
		{"10.0.0.1:80", false, ""},
		{"garbage", false, ""},
	}
	for _, c := range cases {
		d, err := a.Match(c.addr)
		if (err == nil) != c.ok {
			t.Errorf("Match(%q) err=%v, want ok=%v", c.addr, err, c.ok)
			continue
		}
		if c.ok && d.String() != c.dial {
			t.Errorf("Match(%q) dials %s, want %s", c.addr, d, c.dial)
		}
	}
	var empty *AllowList
	if _, err := empty.Match("localhost:6443"); err == nil {
		t.Error("nil allow list must refuse")
	}
	if _, err := NewAllowList([]string{"nope"}); err == nil {
		t.Error("bad entry must fail")
	}
}

func TestParseTarget(t *testing.T) {
	tg, err := ParseTarget("6443:[2001:db8:1f70::999:de8:7648:6e8]:6443")
	if err != nil || tg.LocalPort != 6443 || tg.Dest.String() != "[2001:db8:1f70:0:999:de8:7648:6e8]:6443" {
		t.Fatalf("got %+v %v", tg, err)
	}
	for _, bad := range []string{"6443", "x:localhost:6443", "6443:localhost", "0:localhost:1"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) should fail", bad)
		}
	}
}
