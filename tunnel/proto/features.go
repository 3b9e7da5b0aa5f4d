package proto

import "strings"

// Metadata keys of the upstream protocol.
const (
	MetaAgentID          = "agentid"
	MetaAgentIdentifiers = "agentidentifiers"
	MetaAuthorization    = "authorization"
	HeaderServerID       = "serverid"
	HeaderServerCount    = "servercount"
)

// MetaFeatures is Moat's negotiation key: an agent lists the extensions it
// speaks, the server answers with those it will use. Stock peers neither send
// nor read it, and Moat never uses an extension the peer did not announce.
const MetaFeatures = "moat-tunnel-features"

// Feature names carried in MetaFeatures.
const (
	// FeatureOrigin: the peer understands field 9 and node-originated dials.
	FeatureOrigin = "origin"
	// FeatureCredit: the peer honours per-connection credit (field 10).
	FeatureCredit = "credit"
)

// Features is a parsed MetaFeatures value.
type Features struct{ Origin, Credit bool }

// ParseFeatures reads the comma-separated values of MetaFeatures; unknown
// names are ignored so that newer peers interoperate.
func ParseFeatures(vals []string) Features {
	var f Features
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			switch strings.TrimSpace(s) {
			case FeatureOrigin:
				f.Origin = true
			case FeatureCredit:
				f.Credit = true
			}
		}
	}
	return f
}

// String renders f for MetaFeatures.
func (f Features) String() string {
	var s []string
	if f.Origin {
		s = append(s, FeatureOrigin)
	}
	if f.Credit {
		s = append(s, FeatureCredit)
	}
	return strings.Join(s, ",")
}
