// Package features is Moat's one feature-gate registry
// (k8s.io/component-base/featuregate). Every binary, the CLI included, builds
// its gate here, so one --feature-gates value means the same thing to
// `moat explain`, `moat-agent` and the tunnel. There is no global gate: each
// binary owns the one New returns.
package features

import (
	"fmt"
	"strings"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// IngressNetworksAndNodes gates the NPEP-127 ingress peers of
// ClusterNetworkPolicy (`spec.ingress[].from[].networks` and `.nodes`),
// which Moat implements ahead of upstream and which only the experimental
// CRD accepts.
//
// Off (the default), those two fields are treated as fields Moat does not
// understand: the peer is enforced fail-closed (an Accept rule with it
// matches nothing; a Deny or Pass rule with it denies all traffic to its
// subject) and the policy is reported not Accepted. Turning the gate off
// can only take access away, never grant it.
const IngressNetworksAndNodes featuregate.Feature = "IngressNetworksAndNodes"

// EnableClusterToMasterTraffic turns on KEP-2025 in the tunnel: node
// clients reach control-plane destinations through the agent's local
// listener. Named as in the KEP.
const EnableClusterToMasterTraffic featuregate.Feature = "EnableClusterToMasterTraffic"

// specs are every gate Moat defines.
var specs = map[featuregate.Feature]featuregate.FeatureSpec{
	IngressNetworksAndNodes:      {Default: false, PreRelease: featuregate.Alpha},
	EnableClusterToMasterTraffic: {Default: false, PreRelease: featuregate.Alpha},
}

// New returns a fresh gate holding Moat's features and the logging
// features of k8s.io/component-base (which --logging-format needs), ready
// for AddFlag.
func New() (featuregate.MutableVersionedFeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	if err := fg.Add(specs); err != nil {
		return nil, fmt.Errorf("register Moat feature gates: %w", err)
	}
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, fmt.Errorf("register logging feature gates: %w", err)
	}
	return fg, nil
}

// NewCLI returns a fresh gate holding only the gates that change what the
// policy compiler decides, the ones the moat CLI honours: the CLI has no
// logging flags and no tunnel, so offering those gates there would take
// values that change nothing. The featuregate package always adds its
// AllAlpha and AllBeta toggles too; the CLI refuses them (they would turn
// IngressNetworksAndNodes on unnamed).
func NewCLI() (featuregate.MutableVersionedFeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	cli := map[featuregate.Feature]featuregate.FeatureSpec{}
	for _, g := range policyGates {
		cli[g] = specs[g]
	}
	if err := fg.Add(cli); err != nil {
		return nil, fmt.Errorf("register Moat's compiler feature gates: %w", err)
	}
	return fg, nil
}

// policyGates are the gates that change what the policy compiler decides:
// the ones an operator sets to change enforcement, and the only ones the
// moat CLI honours.
var policyGates = []featuregate.Feature{IngressNetworksAndNodes}

// PolicyGates lists the gates of policyGates that gates holds, as its
// KnownFeatures describes them ("Name=true|false (ALPHA -
// default=false)"), for the --feature-gates help of moat and moat-agent.
// The agent's gate holds more (component-base's logging gates, which its
// --logging-format reads, the tunnel's, and the registry's AllAlpha and
// AllBeta), but listing those beside the compiler's would offer values
// that change nothing an operator enforces with it; both commands list
// the same gates through this one function.
func PolicyGates(gates featuregate.MutableFeatureGate) []string {
	var out []string
	for _, k := range gates.KnownFeatures() {
		name, _, _ := strings.Cut(k, "=")
		for _, g := range policyGates {
			if name == string(g) {
				out = append(out, k)
			}
		}
	}
	return out
}
