package policy

import (
	"testing"
	"unsafe"
)

// TestMatchIndexLayout keeps what an IPv4 lookup reads of a matchIndex
// in its first two cache lines (the second for the pod ordinal only), the index starting a line (see
// matchIndex).
func TestMatchIndexLayout(t *testing.T) {
	var ix matchIndex
	if s := unsafe.Sizeof(bucketLine{}); s != 64 {
		t.Errorf("bucketLine is %d bytes, want 64 (a cache line)", s)
	}
	if s := unsafe.Sizeof(ix); s != 192 {
		t.Errorf("matchIndex is %d bytes, want 192 (a size class of whole cache lines)", s)
	}
	if end := unsafe.Offsetof(ix.cells) + unsafe.Sizeof(ix.cells); unsafe.Offsetof(ix.v4) > unsafe.Offsetof(ix.cells) || end > 64 {
		t.Errorf("podsMin, v4 and cells end at byte %d, past the first cache line", end)
	}
	if off, end := unsafe.Offsetof(ix.pods), unsafe.Offsetof(ix.pods)+unsafe.Sizeof(ix.pods); off < 64 || end > 128 {
		t.Errorf("pods is at bytes [%d, %d), not within the second cache line", off, end)
	}
}

// TestDirPolicyLayout keeps what a verdict reads of a DirPolicy in the
// first cache line of its 128-byte allocation (see DirPolicy).
func TestDirPolicyLayout(t *testing.T) {
	var dp DirPolicy
	if s := unsafe.Sizeof(dp); s > 128 || s <= 112 {
		t.Errorf("DirPolicy is %d bytes, want the 128-byte size class", s)
	}
	for name, end := range map[string]uintptr{
		"indexOnce": unsafe.Offsetof(dp.indexOnce) + unsafe.Sizeof(dp.indexOnce),
		"NP":        unsafe.Offsetof(dp.NP) + unsafe.Sizeof(dp.NP),
		"index":     unsafe.Offsetof(dp.index) + unsafe.Sizeof(dp.index),
		"Admin":     unsafe.Offsetof(dp.Admin) + 16, // pointer and length
	} {
		if end > 64 {
			t.Errorf("DirPolicy.%s ends at byte %d, past the first cache line", name, end)
		}
	}
}
