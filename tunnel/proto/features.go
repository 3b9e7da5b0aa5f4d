package proto

import (
	"strconv"
	"strings"
)

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
	// FeatureWindow ("window=N") announces the sender's per-connection
	// receive window in bytes: the peer starts each connection's send
	// credit at N. Each side announces its own, so the two may differ
	// (--flow-control-window on the server; the agent's is fixed).
	FeatureWindow = "window"
	// FeatureHalfClose: the peer sends and honours field 11 (FIN), so a
	// local side that half-closes its socket (shutdown(SHUT_WR)) still
	// gets its answer; without it either end's EOF closes the connection,
	// as upstream does.
	FeatureHalfClose = "halfclose"
)

// DefaultWindow is the per-connection receive window a peer that announces
// credit but no window is assumed to have (Moat before window announcement
// used it on both sides).
const DefaultWindow = 1 << 20

// Features is a parsed MetaFeatures value.
type Features struct {
	Origin, Credit, HalfClose bool
	// Window is the announced receive window; 0 when none was announced.
	Window int
}

// PeerWindow is the receive window to assume for the peer that sent f.
func (f Features) PeerWindow() int {
	if f.Window > 0 {
		return f.Window
	}
	return DefaultWindow
}

// ParseFeatures reads the comma-separated values of MetaFeatures; unknown
// names are ignored so that newer peers interoperate.
func ParseFeatures(vals []string) Features {
	var f Features
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if n, ok := strings.CutPrefix(s, FeatureWindow+"="); ok {
				// A value that is not a positive int is ignored: the
				// default is assumed, as for a peer that announced none.
				if w, err := strconv.ParseInt(n, 10, 0); err == nil && w > 0 {
					f.Window = int(w)
				}
				continue
			}
			switch s {
			case FeatureOrigin:
				f.Origin = true
			case FeatureCredit:
				f.Credit = true
			case FeatureHalfClose:
				f.HalfClose = true
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
	if f.Window > 0 {
		s = append(s, FeatureWindow+"="+strconv.Itoa(f.Window))
	}
	if f.HalfClose {
		s = append(s, FeatureHalfClose)
	}
	return strings.Join(s, ",")
}
