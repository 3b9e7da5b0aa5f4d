package cputime

import "testing"

// TestProcessAdvances: spinning a while uses CPU time, and Process sees it.
func TestProcessAdvances(t *testing.T) {
	start := Process()
	x := 0
	for i := 0; Process() == start; i++ {
		x += i
		if i > 1e10 {
			t.Fatalf("Process stayed at %v through 1e10 iterations", start)
		}
	}
	_ = x
}
