package peakheap

import (
	"runtime"
	"testing"
)

// TestStartSeesHeldMemory holds 64 MiB across stop: the first sample,
// taken when Start is called, already counts it, so the peak is at least
// that whatever the ticker does.
func TestStartSeesHeldMemory(t *testing.T) {
	const size = 64 << 20
	held := make([]byte, size)
	stop := Start()
	peak := stop()
	runtime.KeepAlive(held)
	if peak < size {
		t.Fatalf("peak = %d B, want at least %d B held", peak, size)
	}
}
