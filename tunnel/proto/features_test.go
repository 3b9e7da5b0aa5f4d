package proto

import "testing"

// The window announcement round-trips; a missing or malformed one means
// the default, so an older Moat or a stock peer is assumed to use 1 MiB.
func TestFeaturesWindow(t *testing.T) {
	f := Features{Origin: true, Credit: true, Window: 65536}
	if got := ParseFeatures([]string{f.String()}); got != f {
		t.Fatalf("round trip: %+v from %q", got, f.String())
	}
	for _, v := range []string{"origin,credit", "credit,window=0", "credit,window=-5", "credit,window=x", ""} {
		if w := ParseFeatures([]string{v}).PeerWindow(); w != DefaultWindow {
			t.Errorf("%q: peer window %d, want the default", v, w)
		}
	}
	if w := ParseFeatures([]string{"credit, window=4194304,future"}).PeerWindow(); w != 4<<20 {
		t.Errorf("peer window %d", w)
	}
}

// Half-close is announced by name and round-trips beside the others; a
// peer that does not name it (a stock peer, an older Moat) has none.
func TestFeaturesHalfClose(t *testing.T) {
	f := Features{Origin: true, Credit: true, Window: 1 << 20, HalfClose: true}
	if got := ParseFeatures([]string{f.String()}); got != f {
		t.Fatalf("round trip: %+v from %q", got, f.String())
	}
	if ParseFeatures([]string{"origin,credit,window=1048576"}).HalfClose {
		t.Error("half-close assumed without being announced")
	}
}
