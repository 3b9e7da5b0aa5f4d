package options

import (
	"strings"
	"testing"

	"github.com/moat-net/moat/tunnel/server"
)

// parse applies args to fresh options as the command line would
// (parseOut without what the flag set printed).
func parse(t *testing.T, args []string) *Options {
	t.Helper()
	o, _ := parseOut(t, args)
	return o
}

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
		{[]string{"--logging-format=xml"}, "logging"},
		{[]string{"--logging-format=json", "-v=4"}, ""},
		{[]string{"--enable-profiling", "--admin-port=0"}, "--enable-profiling"},
		{[]string{"--agent-identity-binding=strict"}, "--agent-identity-binding"},
		{[]string{"--agent-identity-binding=off"}, ""},
		{[]string{"--agent-identity-binding=required"}, ""},
		{[]string{"--node-address-cidrs=192.0.2.0/24,2001:db8::/64"}, ""},
		{[]string{"--node-address-cidrs=192.0.2.0"}, "--node-address-cidrs"},
		{[]string{"--agent-recheck-interval=0"}, ""},
		{[]string{"--agent-recheck-interval=1s"}, "--agent-recheck-interval"},
		{[]string{"--agent-recheck-interval=-1m"}, "--agent-recheck-interval"},
		{[]string{"--node-address-cidrs=fe80::%eth0/64"}, "--node-address-cidrs"},
	}
	for _, c := range cases {
		o := parse(t, append(append([]string{}, base...), c.args...))
		err := o.Validate()
		if c.wantErr == "" && err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%v: err %v, want mention of %q", c.args, err, c.wantErr)
		}
	}
}

// The gate and the allow list reach the server's configuration.
func TestConfig(t *testing.T) {
	o := parse(t, []string{"--feature-gates=EnableClusterToMasterTraffic=true", "--allowed-destination=localhost:6443", "--proxy-strategies=destHost,default"})
	c := o.Config()
	if !c.NodeToControlPlane || c.Allowed.Len() != 1 || len(c.Strategies) != 2 {
		t.Fatalf("config %+v", c)
	}
	if c := parse(t, nil).Config(); c.NodeToControlPlane || c.IdentityBinding != server.BindAuto {
		t.Fatalf("defaults: gate %v, identity binding %q (want off, auto)", c.NodeToControlPlane, c.IdentityBinding)
	}
	if c := parse(t, []string{"--node-address-cidrs=192.0.2.7/24"}).Config(); len(c.NodeCIDRs) != 1 || c.NodeCIDRs[0].String() != "192.0.2.0/24" {
		t.Fatalf("--node-address-cidrs: %v", c.NodeCIDRs)
	}
	if c := parse(t, nil).Config(); c.RecheckInterval != server.DefaultRecheckInterval {
		t.Fatalf("default re-check interval %s", c.RecheckInterval)
	}
	if c := parse(t, []string{"--agent-recheck-interval=0"}).Config(); c.RecheckInterval >= 0 {
		t.Fatalf("--agent-recheck-interval=0: %s, want negative (never)", c.RecheckInterval)
	}
	if c := parse(t, []string{"--agent-identity-binding=off"}).Config(); c.IdentityBinding != server.BindOff {
		t.Fatalf("--agent-identity-binding=off: %q", c.IdentityBinding)
	}
}

// TestKubeconfigRate: --kubeconfig-qps and --kubeconfig-burst set the API
// client's rate (they were accepted and ignored, which left 5,000 agents'
// re-checks behind client-go's 5 requests/s), with defaults above
// client-go's, and a negative rate is refused.
func TestKubeconfigRate(t *testing.T) {
	o, out := parseOut(t, []string{"--kubeconfig-qps=20", "--kubeconfig-burst=40"})
	if o.KubeconfigQPS != 20 || o.KubeconfigBurst != 40 {
		t.Errorf("--kubeconfig-qps=20 --kubeconfig-burst=40: qps %g, burst %d", o.KubeconfigQPS, o.KubeconfigBurst)
	}
	if strings.Contains(out, "kubeconfig-qps") || strings.Contains(out, "kubeconfig-burst") {
		t.Errorf("a flag that takes effect is warned about: %q", out)
	}
	d := parse(t, nil)
	if d.KubeconfigQPS != DefaultKubeconfigQPS || d.KubeconfigBurst != DefaultKubeconfigBurst || DefaultKubeconfigQPS <= 5 {
		t.Errorf("defaults: qps %g, burst %d", d.KubeconfigQPS, d.KubeconfigBurst)
	}
	neg := parse(t, []string{"--cluster-cert=c", "--cluster-key=k", "--cluster-ca-cert=ca", "--uds-name=/tmp/s", "--server-port=0", "--kubeconfig-qps=-1"})
	if err := neg.Validate(); err == nil || !strings.Contains(err.Error(), "--kubeconfig-qps=-1") {
		t.Errorf("--kubeconfig-qps=-1: %v", err)
	}
}
