package nft

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// commentSpec is comment's definition, written the slow way: every
// character mapped, then the whole cut.
func commentSpec(s string) string {
	var b strings.Builder
	for _, r := range s {
		if commentSafe(r) {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > maxComment {
		out = out[:maxComment-3] + "..."
	}
	return out
}

func TestComment(t *testing.T) {
	cases := []string{
		"",
		"Admin Deny cnp-a.ingress[0]",
		"NetworkPolicy ns/a ns/b",
		"quote \" and backslash \\ and tab\t",
		"ünïcödé → pods",
		strings.Repeat("a", maxComment),
		strings.Repeat("a", maxComment+1),
		strings.Repeat("é", maxComment),
		strings.Repeat("x", maxComment-1) + "é",
		strings.Repeat("x", maxComment) + "é",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("aZ9 ._-/:[],()=\"\\'é→\t{}@#")
	for range 500 {
		r := make([]rune, rng.IntN(2*maxComment))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(r))
	}
	for _, c := range cases {
		got, want := comment(c), commentSpec(c)
		if got != want {
			t.Fatalf("comment(%q) = %q, want %q", c, got, want)
		}
		if len(got) > maxComment {
			t.Fatalf("comment(%q) is %d bytes, over %d", c, len(got), maxComment)
		}
		if comment(got) != got {
			t.Fatalf("comment is not idempotent on %q", c)
		}
	}
}
