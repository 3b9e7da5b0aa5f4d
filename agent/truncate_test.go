package agent

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestTruncateKeepsUTF8: a message cut to maxMessage bytes never ends in
// half a character, whatever byte the cut falls on.
func TestTruncateKeepsUTF8(t *testing.T) {
	for pad := range 4 {
		s := strings.Repeat("a", pad) + strings.Repeat("é€😀", maxMessage)
		got := truncate(s)
		if len(got) > maxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
			t.Errorf("pad %d: %d bytes, valid %v, tail %q", pad, len(got), utf8.ValidString(got), got[max(0, len(got)-8):])
		}
	}
	if got := truncate("short é"); got != "short é" {
		t.Errorf("short message changed: %q", got)
	}
}
