package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Names of policy chains and sets are short hashes: deterministic, far
// below nftables' 256-byte limit (and the 32 bytes of old kernels), and
// free of characters nft would need quoted. A chain's name hashes its
// content; a set's name hashes the identity of the rules it serves (not its
// elements), so pod churn changes elements while names stay.
const hashLen = 16

func hashName(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// maxComment is the longest comment nft accepts on a rule.
const maxComment = 128

// comment makes s safe inside an nft quoted comment and short enough.
func comment(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case strings.ContainsRune(" ._-/:[],()=", r):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > maxComment {
		out = out[:maxComment-3] + "..."
	}
	return out
}
