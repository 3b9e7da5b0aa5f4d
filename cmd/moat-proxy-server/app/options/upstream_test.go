package options

import (
	"bytes"
	"crypto/tls"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// upstreamServerArgs is a proxy-server command line as upstream manifests
// write it (the kubernetes.io konnectivity guide's, plus the flags of
// upstream's options that k0s, HyperShift and upstream's e2e manifests set).
var upstreamServerArgs = []string{
	"--logtostderr=true", "--alsologtostderr", "--log-file=/var/log/konnectivity-server.log", "--log-file-max-size=100",
	"--stderrthreshold=INFO", "--one-output", "--skip-headers=false", "--v=4",
	"--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket", "--delete-existing-uds-file",
	"--cluster-cert=/etc/kubernetes/pki/apiserver.crt", "--cluster-key=/etc/kubernetes/pki/apiserver.key",
	"--mode=grpc", "--server-port=0", "--agent-port=8132", "--admin-port=8133", "--health-port=8134",
	"--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent",
	"--kubeconfig=/etc/kubernetes/konnectivity-server.conf", "--authentication-audience=system:konnectivity-server",
	"--keepalive-time=1h", "--frontend-keepalive-time=1h", "--enable-contention-profiling=false",
	"--kubeconfig-qps=50", "--kubeconfig-burst=100", "--kube-api-content-type=application/vnd.kubernetes.protobuf",
	"--xfr-channel-size=150", "--frontend-write-channel-size=10", "--warn-on-channel-limit",
	"--enable-lease-controller", "--lease-namespace=kube-system", "--lease-label=k8s-app=konnectivity-server",
	"--server-count=3", "--proxy-strategies=destHost,default",
	"--backend-dial-timeout=7s", "--graceful-shutdown-timeout=15s",
	"--tls-min-version=VersionTLS13", "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
}

// parseOut is parse that also returns what the flag set printed.
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

// An upstream manifest's command line parses and validates
// (--logtostderr, --keepalive-time and the rest made startup fail). The
// flags Moat ignores are warned about; those with a Moat equivalent take
// effect.
func TestUpstreamServerFlags(t *testing.T) {
	o, out := parseOut(t, upstreamServerArgs)
	if err := o.Validate(); err != nil {
		t.Fatalf("upstream flags: %v", err)
	}
	for _, f := range []string{"logtostderr", "log-file", "keepalive-time", "enable-lease-controller", "xfr-channel-size", "backend-dial-timeout"} {
		if !strings.Contains(out, "Flag --"+f+" has been deprecated") {
			t.Errorf("no warning for --%s in %q", f, out)
		}
	}
	if o.DialTimeout != 7*time.Second {
		t.Errorf("--backend-dial-timeout=7s: dial timeout %s", o.DialTimeout)
	}
	if o.ShutdownGrace != 15*time.Second {
		t.Errorf("--graceful-shutdown-timeout=15s: grace %s", o.ShutdownGrace)
	}
	if o.TLSVersion() != tls.VersionTLS13 {
		t.Errorf("--tls-min-version=VersionTLS13: %x", o.TLSVersion())
	}
	if want := []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}; !slices.Equal(o.TLSCipherSuites(), want) {
		t.Errorf("--cipher-suites: %x", o.TLSCipherSuites())
	}
	if c := o.Config(); c.ServerCount != 3 || c.DialTimeout != 7*time.Second {
		t.Errorf("config %+v", c)
	}
}

// Upstream's "no bound" (0) leaves Moat's dial timeout; TLS never goes
// below 1.2; a bad TLS flag value is refused naming its flag.
func TestUpstreamServerFlagEdges(t *testing.T) {
	base := []string{"--cluster-cert=c", "--cluster-key=k", "--cluster-ca-cert=ca", "--uds-name=/tmp/s", "--server-port=0"}
	o, _ := parseOut(t, append(base, "--backend-dial-timeout=0"))
	if o.DialTimeout != 10*time.Second {
		t.Errorf("--backend-dial-timeout=0: dial timeout %s, want the default", o.DialTimeout)
	}
	o, _ = parseOut(t, append(base, "--tls-min-version=VersionTLS10"))
	if err := o.Validate(); err != nil || o.TLSVersion() != tls.VersionTLS12 {
		t.Errorf("--tls-min-version=VersionTLS10: %v, version %x, want TLS 1.2", err, o.TLSVersion())
	}
	for _, bad := range []string{"--tls-min-version=TLS13", "--cipher-suites=TLS_NOPE"} {
		o, _ = parseOut(t, append(base, bad))
		flag, _, _ := strings.Cut(bad, "=")
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// PROXY_SERVER_ID is the default server ID, as upstream's; --server-id
// overrides it.
func TestProxyServerIDEnv(t *testing.T) {
	t.Setenv("PROXY_SERVER_ID", "konnectivity-server-1")
	if o, _ := parseOut(t, nil); o.ServerID != "konnectivity-server-1" {
		t.Errorf("server ID %q", o.ServerID)
	}
	if o, _ := parseOut(t, []string{"--server-id=x"}); o.ServerID != "x" {
		t.Errorf("server ID %q", o.ServerID)
	}
}

// Token authentication without --authentication-audience starts (upstream
// refuses) but is warned about, saying what kube-apiserver does then
// (TestTokenReviewRealAPIServer checks it): the agents' tokens must be
// valid for the API server itself, so the proxy server could replay them,
// and tokens for this server's audience are refused.
func TestWarnings(t *testing.T) {
	base := []string{"--cluster-cert=c", "--cluster-key=k", "--uds-name=/tmp/s", "--server-port=0",
		"--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent"}
	o, _ := parseOut(t, base)
	w := o.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "--authentication-audience") {
		t.Fatalf("warnings %q", w)
	}
	for _, want := range []string{"valid for its own audiences", "replay", "system:konnectivity-server", "are refused"} {
		if !strings.Contains(w[0], want) {
			t.Errorf("warning %q does not say %q", w[0], want)
		}
	}
	if strings.Contains(w[0], "another audience") {
		t.Errorf("warning %q says other-audience tokens are accepted; kube-apiserver refuses them", w[0])
	}
	o, _ = parseOut(t, append(base, "--authentication-audience=system:konnectivity-server"))
	if w := o.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}
}
