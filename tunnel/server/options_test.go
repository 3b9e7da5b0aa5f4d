package server

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	base := []string{"--cluster-cert=c", "--cluster-key=k", "--cluster-ca-cert=ca", "--uds-name=/tmp/s", "--server-port=0"}
	cases := []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--mode=socks"}, "--mode"},
		{[]string{"--uds-name="}, "--uds-name is empty"},
		{[]string{"--server-port=8090"}, "--server-cert"},
		{[]string{"--server-port=8090", "--server-cert=a", "--server-key=b"}, "--server-ca-cert"},
		{[]string{"--agent-port=70000"}, "--agent-port"},
		{[]string{"--server-count=0"}, "--server-count"},
		{[]string{"--proxy-strategies=default,roundRobin"}, "--proxy-strategies"},
		{[]string{"--agent-namespace=kube-system"}, "--agent-namespace"},
		{[]string{"--allowed-destination=localhost"}, "--allowed-destination"},
		{[]string{"--allowed-destination=[fe80::1%eth0]:443"}, "--allowed-destination"},
		{[]string{"--cluster-ca-cert="}, "--cluster-ca-cert or --agent-service-account"},
		{[]string{"--cluster-ca-cert=", "--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent"}, ""},
		{[]string{"--feature-gates=EnableClusterToMasterTraffic=true", "--allowed-destination=localhost:6443"}, ""},
	}
	for _, c := range cases {
		o, err := NewOptions()
		if err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(append(append([]string{}, base...), c.args...)); err != nil {
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
