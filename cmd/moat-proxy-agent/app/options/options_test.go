package options

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/moat-net/moat/tunnel/proto"
)

// parseOut parses args as the command does and returns the options and
// what the flag set printed (deprecation warnings).
func parseOut(t *testing.T, args []string) (*Options, string) {
	t.Helper()
	o, err := New()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.SetOutput(&out)
	for _, f := range o.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return o, out.String()
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--ca-cert=ca"}, ""},
		{nil, "--ca-cert"},
		{[]string{"--ca-cert=ca", "--agent-cert=c"}, "--agent-key"},
		{[]string{"--ca-cert=ca", "--proxy-server-port=0"}, "--proxy-server-port"},
		{[]string{"--ca-cert=ca", "--target=6443:localhost:6443"}, "--bind-address"},
		{[]string{"--ca-cert=ca", "--bind-address=10.0.0.1", "--target=6443:localhost"}, "--target"},
		{[]string{"--ca-cert=ca", "--bind-address=10.0.0.1", "--target=6443:a:1", "--target=6443:b:2"}, "used twice"},
		{[]string{"--ca-cert=ca", "--bind-address=nope", "--target=6443:a:1"}, "--bind-address"},
		{[]string{"--ca-cert=ca", "--bind-address=0.0.0.0", "--target=6443:a:1"}, "unspecified"},
		{[]string{"--ca-cert=ca", "--bind-address=::", "--target=6443:a:1"}, "unspecified"},
		{[]string{"--ca-cert=ca", "--bind-address=224.0.0.1", "--target=6443:a:1"}, "multicast"},
		{[]string{"--ca-cert=ca", "--bind-address=10.0.0.1", "--target=6443:[2001:db8::1]:6443"}, ""},
		{[]string{"--ca-cert=ca", "--agent-identifiers=colour=red"}, "--agent-identifiers"},
		{[]string{"--ca-cert=ca", "--sync-interval=0s"}, "--sync-interval"},
		{[]string{"--ca-cert=ca", "--logging-format=xml"}, "logging"},
		{[]string{"--ca-cert=ca", "--logging-format=json", "-v=2", "--feature-gates=EnableClusterToMasterTraffic=true"}, ""},
	}
	for _, c := range cases {
		o, _ := parseOut(t, c.args)
		err := o.Validate()
		if c.wantErr == "" && err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%v: err %v, want mention of %q", c.args, err, c.wantErr)
		}
	}
}

// Without --agent-id, an agent whose certificate names a node (CN
// system:node:<node>) announces that node's name, the one ID a server
// binding identities accepts from it; --agent-id always wins, and other
// certificates keep the generated UUID.
func TestAgentIDFor(t *testing.T) {
	node := &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:node-a"}}
	shared := &x509.Certificate{Subject: pkix.Name{CommonName: "proxy-agent"}}
	o, err := New()
	if err != nil {
		t.Fatal(err)
	}
	generated := o.AgentID
	for _, c := range []struct {
		cert *x509.Certificate
		want string
	}{{node, "node-a"}, {shared, generated}, {nil, generated}} {
		if got := o.AgentIDFor(c.cert); got != c.want {
			t.Errorf("default, cert %v: %q, want %q", c.cert != nil, got, c.want)
		}
	}
	o.AgentID = "given"
	if got := o.AgentIDFor(node); got != "given" {
		t.Errorf("--agent-id=given, node certificate: %q", got)
	}
}

// TestIdentifiersFor: an agent whose certificate names its node claims the
// certificate's SANs besides --agent-identifiers (the shipped manifests
// give only default-route=true, which routes no node's connections to
// it); other certificates, and --identifiers-from-cert=false, leave the
// flag as given.
func TestIdentifiersFor(t *testing.T) {
	node := &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:node-a"}, DNSNames: []string{"node-a", "Node-A.Example."},
		IPAddresses: []net.IP{net.ParseIP("192.0.2.10"), net.ParseIP("2001:db8::a"), net.ParseIP("::ffff:192.0.2.10")}}
	shared := &x509.Certificate{Subject: pkix.Name{CommonName: "proxy-agent"}, DNSNames: []string{"node-a"}}
	for _, c := range []struct {
		args []string
		cert *x509.Certificate
		want string
	}{
		{[]string{"--agent-identifiers=default-route=true"}, node, "default-route=true&host=node-a&host=node-a.example&ipv4=192.0.2.10&ipv6=2001%3Adb8%3A%3Aa"},
		{nil, node, "host=node-a&host=node-a.example&ipv4=192.0.2.10&ipv6=2001%3Adb8%3A%3Aa"},
		{[]string{"--agent-identifiers=host=node-a&ipv4=192.0.2.10"}, node, "host=node-a&host=node-a.example&ipv4=192.0.2.10&ipv6=2001%3Adb8%3A%3Aa"},
		{[]string{"--agent-identifiers=default-route=true"}, shared, "default-route=true"},
		{[]string{"--agent-identifiers=default-route=true"}, nil, "default-route=true"},
		{[]string{"--agent-identifiers=default-route=true", "--identifiers-from-cert=false"}, node, "default-route=true"},
	} {
		o, _ := parseOut(t, c.args)
		got := o.IdentifiersFor(c.cert)
		if got != c.want {
			t.Errorf("%v, certificate %v: %q, want %q", c.args, c.cert != nil, got, c.want)
		}
		if _, err := proto.ParseIdentifiers(got); err != nil {
			t.Errorf("%v: %q does not parse: %v", c.args, got, err)
		}
	}
}

// Config carries every flag the library reads, and a bind address only
// when something listens on it (the gate on and a --target): otherwise
// the run loop would add an address nothing uses.
func TestFlagsFillConfig(t *testing.T) {
	args := []string{"--ca-cert=ca", "--proxy-server-host=10.1.2.3", "--proxy-server-port=8132", "--agent-id=node1",
		"--agent-identifiers=host=node1", "--service-account-token-path=/t", "--sync-interval=2s", "--sync-interval-cap=20s",
		"--dial-timeout=3s", "--connect-timeout=15s", "--bind-address=169.254.169.1", "--target=6443:kubernetes:443"}
	for _, gate := range []bool{false, true} {
		a := args
		if gate {
			a = append(a, "--feature-gates=EnableClusterToMasterTraffic=true")
		}
		o, _ := parseOut(t, a)
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		c := o.Config()
		if c.Server != "10.1.2.3:8132" || c.AgentID != "node1" || c.Identifiers != "host=node1" || c.TokenPath != "/t" ||
			c.SyncInterval != 2*time.Second || c.MaxBackoff != 20*time.Second || c.DialTimeout != 3*time.Second ||
			c.ConnectTimeout != 15*time.Second || c.NodeToControlPlane != gate || len(c.Targets) != 1 || c.Targets[0].LocalPort != 6443 {
			t.Errorf("gate %v: Config() = %+v", gate, c)
		}
		if got := c.BindAddress; gate != (got != nil) || (gate && got.String() != "169.254.169.1") {
			t.Errorf("gate %v: Config().BindAddress = %v", gate, got)
		}
	}
}
