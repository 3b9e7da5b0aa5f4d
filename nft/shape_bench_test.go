package nft

import (
	"context"
	"testing"
	"time"
)

// BenchmarkVerifyReadings programs benchNode of the agent scale
// benchmark's 30,000-pod cluster (BenchmarkReadCounters' table) in a
// private network namespace and times, alternating in each iteration,
// the two readings of a Verify that finds the generation moved:
// NetlinkShape (table, chains, rules) and NetlinkCounters. CPU as in
// BenchmarkReadCounters (the dumps run in the kernel on this process's
// behalf).
func BenchmarkVerifyReadings(b *testing.B) {
	_, s, res, leave := syncBenchNode(b)
	defer leave()
	ctx := context.Background()
	readings := []struct {
		name string
		read func() error
	}{
		{"shape", func() error {
			sh, err := NetlinkShape{}.ReadShape(ctx, countedChains())
			if err == nil {
				if d := shapeDiff(s.Applied().expectedShape(), sh, true); d != "" {
					b.Fatalf("shape differs from the programmed ruleset's: %s", d)
				}
			}
			return err
		}},
		{"counters", func() error { _, err := NetlinkCounters{}.ReadCounters(ctx); return err }},
	}
	var wall, cpu [2]time.Duration
	n := 0
	for b.Loop() {
		for i, rd := range readings {
			c0 := cpuTime(b)
			t0 := time.Now()
			err := rd.read()
			wall[i] += time.Since(t0)
			cpu[i] += cpuTime(b) - c0
			if err != nil {
				b.Fatalf("%s: %v", rd.name, err)
			}
		}
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	for i, rd := range readings {
		b.ReportMetric(ms(wall[i]), rd.name+"-ms/read")
		b.ReportMetric(ms(cpu[i]), rd.name+"-cpu-ms/read")
	}
	b.ReportMetric(float64(res.Stats.Chains), "chains")
	b.ReportMetric(float64(res.Stats.Rules), "rules")
}
