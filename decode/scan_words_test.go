package decode

import (
	"encoding/binary"
	"math/bits"
	"testing"
)

// TestWordStops checks the word-at-a-time scans against the byte tables
// they stand for: for every byte value at every position of a word, with
// every other byte filler or another stop, the lowest byte flagged is the
// first byte the byte-at-a-time scan would stop at.
func TestWordStops(t *testing.T) {
	stops := map[string]struct {
		word func(uint64) uint64
		stop func(byte) bool
	}{
		"structStop": {structStop, func(c byte) bool { return structural[c] }},
		"stringStop": {stringStop, func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }},
	}
	fillers := []byte{' ', 'a', 0x7f, 0x80, 0xff, '{' ^ 0x20, '}' ^ 0x20, ':'}
	for name, tc := range stops {
		for _, fill := range fillers {
			for pos := range 8 {
				for v := range 256 {
					for _, after := range []byte{fill, '"', '[', 0x00, 0x5d} {
						var w [8]byte
						for i := range w {
							w[i] = fill
						}
						w[pos] = byte(v)
						for i := pos + 1; i < 8; i++ {
							w[i] = after
						}
						want := 8
						for i, c := range w {
							if tc.stop(c) {
								want = i
								break
							}
						}
						got := 8
						if m := tc.word(binary.LittleEndian.Uint64(w[:])); m != 0 {
							got = bits.TrailingZeros64(m) / 8
						}
						if got != want {
							t.Fatalf("%s(% x) stops at %d, want %d", name, w, got, want)
						}
					}
				}
			}
		}
	}
}
