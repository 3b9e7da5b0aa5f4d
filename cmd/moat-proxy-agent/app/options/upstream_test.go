package options

import (
	"strings"
	"testing"
)

// An upstream proxy-agent command line, as the kubernetes.io konnectivity
// guide, k0s, HyperShift and upstream's e2e manifests write it, parses and
// validates (--logtostderr, --probe-interval and the rest made
// startup fail); the flags Moat ignores are warned about.
func TestUpstreamAgentFlags(t *testing.T) {
	args := []string{
		"--logtostderr=true", "--alsologtostderr", "--v=4", "--log-file=/var/log/konnectivity-agent.log",
		"--ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
		"--proxy-server-host=35.225.206.7", "--proxy-server-port=8132",
		"--admin-server-port=8133", "--health-server-port=8134",
		"--service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token",
		"--agent-identifiers=ipv4=10.0.0.5&host=node1", "--agent-id=node1",
		"--sync-interval=1s", "--sync-interval-cap=10s", "--sync-forever", "--probe-interval=1s",
		"--keepalive-time=1h", "--server-count=1", "--count-server-leases", "--server-count-lease-selector=k8s-app=konnectivity-server",
		"--xfr-channel-size=150", "--warn-on-channel-limit", "--enable-contention-profiling=false",
		"--enable-push-service-account-token=false", "--alpn-proto=konnectivity",
	}
	o, out := parseOut(t, args)
	if err := o.Validate(); err != nil {
		t.Fatalf("upstream flags: %v", err)
	}
	for _, f := range []string{"logtostderr", "sync-forever", "probe-interval", "keepalive-time", "count-server-leases", "alpn-proto"} {
		if !strings.Contains(out, "Flag --"+f+" has been deprecated") {
			t.Errorf("no warning for --%s in %q", f, out)
		}
	}
	if o.ProxyServerPort != 8132 || o.AgentID != "node1" {
		t.Errorf("options %+v", o)
	}
}
