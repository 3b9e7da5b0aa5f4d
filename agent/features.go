package agent

import (
	"fmt"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// IngressNetworksAndNodes gates the NPEP-127 ingress peers of
// ClusterNetworkPolicy (`spec.ingress[].from[].networks` and `.nodes`),
// which Moat implements ahead of upstream and which only the experimental
// CRD accepts.
//
// Off (the default) means this agent treats those two fields as fields it
// does not understand: the peer is an empty one-of and is enforced
// fail-closed (an Accept rule with it matches nothing; a Deny or Pass rule
// with it denies all traffic to its subject), and the policy gets
// Accepted=False with reason UnknownField naming the field and the gate.
// Nothing is silently ignored, so turning the gate off can only take access
// away, never grant it.
const IngressNetworksAndNodes featuregate.Feature = "IngressNetworksAndNodes"

// agentFeatures are the agent's own gates.
var agentFeatures = map[featuregate.Feature]featuregate.FeatureSpec{
	IngressNetworksAndNodes: {Default: false, PreRelease: featuregate.Alpha},
}

// NewFeatureGate returns a fresh gate with the agent's features and the
// logging features of k8s.io/component-base (for --logging-format), ready
// for AddFlag. Each agent gets its own: there is no global gate.
func NewFeatureGate() (featuregate.MutableVersionedFeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	if err := fg.Add(agentFeatures); err != nil {
		return nil, fmt.Errorf("register agent feature gates: %w", err)
	}
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, fmt.Errorf("register logging feature gates: %w", err)
	}
	return fg, nil
}
