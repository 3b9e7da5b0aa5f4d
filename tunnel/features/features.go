// Package features defines the tunnel's feature gates (k8s.io/component-base),
// shared by moat-proxy-server and moat-proxy-agent so that one
// --feature-gates value means the same on both.
package features

import "k8s.io/component-base/featuregate"

// EnableClusterToMasterTraffic turns on KEP-2025: node clients reach
// control-plane destinations through the tunnel. Name as in the KEP.
const EnableClusterToMasterTraffic featuregate.Feature = "EnableClusterToMasterTraffic"

// NewGate returns a fresh gate with the tunnel's features registered; each
// binary owns its own (no global state).
func NewGate() (featuregate.MutableFeatureGate, error) {
	g := featuregate.NewFeatureGate()
	err := g.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		EnableClusterToMasterTraffic: {Default: false, PreRelease: featuregate.Alpha},
	})
	return g, err
}
