package agent

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/features"
)

// Config is everything about an agent that is not a client or the
// dataplane. cmd/moat-agent/app fills it from its options.
type Config struct {
	// NodeName is the node whose pods this agent enforces for.
	NodeName string
	// AllowNodeLocal lets the node's own addresses reach its pods whatever
	// the policies say (kubelet probes); false polices that traffic too.
	AllowNodeLocal bool
	// Resync is how often the agent compiles from the caches from
	// scratch and, when anything else committed to nftables since its
	// last transaction, rewrites the whole table in one transaction,
	// repairing edits made behind its back (Agent.CheckedResync). Zero
	// turns the timer off.
	Resync time.Duration
	// Features holds the feature gates (features.New); nil means every
	// gate at its default.
	Features featuregate.FeatureGate
	// LeaderElection decides which agent writes ClusterNetworkPolicy
	// status and policy Events.
	LeaderElection LeaderElection
	// SyncTimeout bounds one nftables transaction (default 1 minute).
	SyncTimeout time.Duration
	// PodWithoutIPAfter is how long a pod of this node may be scheduled
	// without an IP before it is reported as pod_without_ip (default 60
	// s; negative: at once). Every pod passes through that state for a
	// few seconds while its sandbox starts, which is no problem; other
	// nodes' pods are never reported (only logged at -v=2), since this
	// agent can do nothing about them.
	PodWithoutIPAfter time.Duration
}

// LeaderElection configures the status writer's Lease.
type LeaderElection struct {
	// Enabled: without it this agent never writes status or policy Events.
	Enabled bool
	// Namespace and Name of the Lease (default moat-system/moat-agent).
	Namespace, Name string
	// Identity of this agent in the Lease (default NodeName).
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod as in client-go's
	// leaderelection (zero: DefaultLeaseDuration, DefaultRenewDeadline,
	// DefaultRetryPeriod); see CheckTiming.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Candidates is how many agents campaign for the Lease: those of the
	// nodes first in hash order of their names (election.go); the others
	// stand by and campaign only once the Lease is abandoned. 0 means
	// DefaultCandidates, negative every agent.
	Candidates int
}

// DefaultLeaseNamespace is where the Lease lives unless configured.
const DefaultLeaseNamespace = "moat-system"

// The election's default timing, client-go's and kube-controller-manager's.
// moat-agent's flags take their defaults from here, so that the command
// and library users of Config run the same election.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// CheckTiming reports whether the durations, as given (no defaults
// applied), can run an election: 0 < RetryPeriod < RenewDeadline <
// LeaseDuration, as client-go's leaderelection requires. It is the one
// place the rule is written: New applies it after defaults, moat-agent's
// Validate to the flags.
func (le LeaderElection) CheckTiming() error {
	if le.RetryPeriod <= 0 || le.RetryPeriod >= le.RenewDeadline || le.RenewDeadline >= le.LeaseDuration {
		// No values: callers name them (New by field, moat-agent by flag).
		return errors.New("want 0 < retry period < renew deadline < lease duration")
	}
	return nil
}

func (c *Config) complete() error {
	if c.NodeName == "" {
		return errors.New("node name is empty: set --node-name or the NODE_NAME environment variable")
	}
	if c.Resync < 0 {
		return fmt.Errorf("resync period %s is negative", c.Resync)
	}
	if c.Features == nil {
		fg, err := features.New()
		if err != nil {
			return err
		}
		c.Features = fg
	}
	if c.SyncTimeout <= 0 {
		c.SyncTimeout = time.Minute
	}
	if c.PodWithoutIPAfter == 0 {
		c.PodWithoutIPAfter = time.Minute
	}
	le := &c.LeaderElection
	if le.Namespace == "" {
		le.Namespace = DefaultLeaseNamespace
	}
	if le.Name == "" {
		le.Name = "moat-agent"
	}
	if le.Identity == "" {
		le.Identity = c.NodeName
	}
	if le.LeaseDuration <= 0 {
		le.LeaseDuration = DefaultLeaseDuration
	}
	if le.RenewDeadline <= 0 {
		le.RenewDeadline = DefaultRenewDeadline
	}
	if le.RetryPeriod <= 0 {
		le.RetryPeriod = DefaultRetryPeriod
	}
	if le.Candidates == 0 {
		le.Candidates = DefaultCandidates
	}
	// Without an election the timing is unused: moat-agent
	// --leader-elect=false ignores the --leader-elect-* durations.
	if le.Enabled {
		if err := le.CheckTiming(); err != nil {
			return fmt.Errorf("leader election: retry period %s, renew deadline %s, lease duration %s: %w", le.RetryPeriod, le.RenewDeadline, le.LeaseDuration, err)
		}
	}
	return nil
}

// Clients are the API clients an agent uses.
type Clients struct {
	// Kube reads pods, namespaces and nodes and writes Events and the
	// Lease.
	Kube kubernetes.Interface
	// Dynamic reads policies as JSON (strict decoding) and writes
	// ClusterNetworkPolicy status.
	Dynamic dynamic.Interface
}

// NewClients builds the clients from a REST config: core objects travel
// as protobuf (smaller and faster to decode for thousands of pods),
// policies as JSON, which strict decoding needs.
func NewClients(cfg *rest.Config) (Clients, error) {
	pb := rest.CopyConfig(cfg)
	pb.ContentType = "application/vnd.kubernetes.protobuf"
	pb.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kube, err := kubernetes.NewForConfig(pb)
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("dynamic client: %w", err)
	}
	return Clients{Kube: kube, Dynamic: dyn}, nil
}
