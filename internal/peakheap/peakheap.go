// Package peakheap measures the most live heap a piece of work held at
// once, which benchmarks report beside B/op: B/op counts what was
// allocated, a peak what had to fit in memory together.
package peakheap

import (
	"runtime/metrics"
	"sync"
	"time"
)

// Start samples the live heap every few milliseconds until stop is
// called, and stop returns the largest sample. Sampling, not a hook in
// the allocator, so a peak shorter than the interval can be missed: the
// figure is a lower bound, good for work that holds its memory for tens
// of milliseconds or more.
func Start() (stop func() uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}
