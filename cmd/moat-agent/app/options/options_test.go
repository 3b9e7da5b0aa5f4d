package options

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want []string // substrings of the error; none: valid
	}{
		{"defaults with a node", func(o *Options) {}, nil},
		{"no node", func(o *Options) { o.NodeName = "" }, []string{"--node-name is empty"}},
		{"negative resync", func(o *Options) { o.Resync = -time.Second }, []string{"--resync=-1s"}},
		{"resync off", func(o *Options) { o.Resync = 0 }, nil},
		{"port only", func(o *Options) { o.MetricsBindAddress = "9470" }, []string{"--metrics-bind-address=9470: want host:port"}},
		{"health off", func(o *Options) { o.HealthBindAddress = "" }, nil},
		{"no lease namespace", func(o *Options) { o.LeaderElectionNamespace = "" }, []string{"--leader-election-namespace"}},
		{"no lease namespace without election", func(o *Options) { o.LeaderElectionNamespace, o.LeaderElect = "", false }, nil},
		{"retry period not below renew deadline", func(o *Options) { o.RetryPeriod = 10 * time.Second }, []string{"--leader-elect-retry-period=10s"}},
		{"zero retry period", func(o *Options) { o.RetryPeriod = 0 }, []string{"--leader-elect-retry-period=0s", "0 < retry period"}},
		{"lease duration not above renew deadline", func(o *Options) { o.LeaseDuration = o.RenewDeadline }, []string{"--leader-elect-lease-duration=10s"}},
		{"election timing ignored without election", func(o *Options) { o.LeaderElect, o.RetryPeriod = false, time.Hour }, nil},
		{"profiling without metrics", func(o *Options) { o.Profiling, o.MetricsBindAddress = true, "" }, []string{"--profiling needs --metrics-bind-address"}},
		{"key without certificate", func(o *Options) { o.TLSPrivateKeyFile = "/k" }, []string{"--tls-cert-file and --tls-private-key-file"}},
		{"certificate and key", func(o *Options) { o.TLSCertFile, o.TLSPrivateKeyFile = "/c", "/k" }, nil},
		{"certificate without secure metrics", func(o *Options) { o.TLSCertFile, o.TLSPrivateKeyFile, o.MetricsSecure = "/c", "/k", false }, []string{"--tls-cert-file needs --metrics-secure"}},
		{"bad log format", func(o *Options) { o.Logging.Format = "xml" }, []string{"xml"}},
		{"every problem at once", func(o *Options) { o.NodeName, o.HealthBindAddress = "", "x" }, []string{"--node-name", "--health-bind-address=x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := New()
			if err != nil {
				t.Fatal(err)
			}
			o.NodeName = "n1"
			tc.mod(o)
			err = o.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestFlagsFillConfig(t *testing.T) {
	t.Setenv("NODE_NAME", "from-env")
	t.Setenv("POD_NAMESPACE", "ns-from-env")
	o, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if !o.MetricsSecure {
		t.Error("metrics are not secure by default: the agent runs in the host network")
	}
	fss := o.Flags()
	args := map[string]string{
		"allow-node-local": "false", "resync": "30s", "leader-elect": "false", "feature-gates": "IngressNetworksAndNodes=true",
		"leader-elect-lease-duration": "2m", "leader-elect-renew-deadline": "90s", "leader-elect-retry-period": "30s",
		"leader-elect-candidates": "5",
	}
	for name, v := range args {
		found := false
		for _, fs := range fss.FlagSets {
			if f := fs.Lookup(name); f != nil {
				found = true
				if err := fs.Set(name, v); err != nil {
					t.Fatalf("--%s=%s: %v", name, v, err)
				}
			}
		}
		if !found {
			t.Fatalf("no flag --%s", name)
		}
	}
	c := o.Config()
	if c.NodeName != "from-env" || c.AllowNodeLocal || c.Resync != 30*time.Second || c.LeaderElection.Enabled || c.LeaderElection.Namespace != "ns-from-env" {
		t.Errorf("Config() = %+v", c)
	}
	if le := c.LeaderElection; le.LeaseDuration != 2*time.Minute || le.RenewDeadline != 90*time.Second || le.RetryPeriod != 30*time.Second || le.Candidates != 5 {
		t.Errorf("Config().LeaderElection = %+v, want the --leader-elect-* durations and 5 candidates", le)
	}
	o.Candidates = 0
	if n := o.Config().LeaderElection.Candidates; n >= 0 {
		t.Errorf("--leader-elect-candidates=0: Config() candidates %d, want negative (every agent campaigns)", n)
	}
	if !c.Features.Enabled("IngressNetworksAndNodes") {
		t.Error("--feature-gates did not reach Config().Features")
	}
}

// TestGCPercentDefault: the agent asks for its own garbage-collection
// target (applied unless GOGC is set) below Go's default: its heap is
// mostly long-lived caches (BENCHMARKS.md, Agent).
func TestGCPercentDefault(t *testing.T) {
	o, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if o.GCPercent != GCPercent || GCPercent <= 0 || GCPercent >= 100 {
		t.Errorf("GCPercent %d (constant %d): want the agent's own target below Go's 100", o.GCPercent, GCPercent)
	}
}
