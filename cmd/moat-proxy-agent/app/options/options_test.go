package options

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

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
		o, err := New()
		if err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		for _, f := range o.Flags().FlagSets {
			fs.AddFlagSet(f)
		}
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		err = o.Validate()
		if c.wantErr == "" && err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%v: err %v, want mention of %q", c.args, err, c.wantErr)
		}
	}
}
