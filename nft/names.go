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
	var arr [512]byte
	return hashBytes(prefix, joinParts(arr[:0], parts...))
}

// joinParts appends parts to dst, each ended by a 0 byte: the form names
// and run keys hash.
func joinParts(dst []byte, parts ...string) []byte {
	for _, p := range parts {
		dst = append(append(dst, p...), 0)
	}
	return dst
}

// hashBytes is hashName of parts already joined (joinParts).
func hashBytes(prefix string, joined []byte) string {
	sum := sha256.Sum256(joined)
	var arr [64]byte
	out := append(arr[:0], prefix...)
	return string(hex.AppendEncode(out, sum[:hashLen/2]))
}

// maxComment is the longest comment nft accepts on a rule.
const maxComment = 128

// comment makes s safe inside an nft quoted comment and short enough:
// characters outside a safe set become '_', and a comment longer than
// maxComment is cut to end in "...". A comment that needs neither is
// returned as it is.
func comment(s string) string {
	if len(s) <= maxComment && !strings.ContainsFunc(s, func(r rune) bool { return !commentSafe(r) }) {
		return s
	}
	// Every character becomes one byte, so the first maxComment+1 are
	// enough to know the result.
	b := make([]byte, 0, maxComment+1)
	for _, r := range s {
		if len(b) > maxComment {
			break
		}
		if commentSafe(r) {
			b = append(b, byte(r))
		} else {
			b = append(b, '_')
		}
	}
	if len(b) > maxComment {
		b = append(b[:maxComment-3], "..."...)
	}
	return string(b)
}

func commentSafe(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(" ._-/:[],()=", r)
}
