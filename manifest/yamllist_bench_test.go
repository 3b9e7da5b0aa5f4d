package manifest

import (
	"bufio"
	"bytes"
	"runtime"
	"testing"
	"time"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/cputime"
	"github.com/moat-net/moat/internal/peakheap"
)

// BenchmarkYAMLList reads the 10k-pod cluster as `kubectl get -A -o yaml`
// prints it (one List document, 47 MB) in batches (how decodeYAML reads
// it) and whole (how every document was read before: wholeDoc), the two
// alternating in every iteration: elapsed time, CPU time (all threads)
// and peak live heap of each.
//
//	go test -run '^$' -bench 'BenchmarkYAMLList' -benchtime 3x ./manifest/
func BenchmarkYAMLList(b *testing.B) {
	var js bytes.Buffer
	if err := clustergen.Generate(clustergen.Scale).WriteJSON(&js, clustergen.Kubectl); err != nil {
		b.Fatal(err)
	}
	doc, err := sigsyaml.JSONToYAML(js.Bytes())
	if err != nil {
		b.Fatal(err)
	}
	js = bytes.Buffer{}
	b.SetBytes(int64(len(doc)))
	type figures struct{ elapsed, cpu time.Duration }
	var sum [2]figures
	var peak [2]uint64
	for b.Loop() {
		for i, how := range []string{"batches", "whole"} {
			runtime.GC()
			stop := peakheap.Start()
			t0, c0 := time.Now(), cputime.Process()
			res := &decode.Result{}
			var err error
			if how == "batches" {
				err = decodeYAML(res, "dump.yaml", bufio.NewReader(bytes.NewReader(doc)), 1)
			} else {
				err = wholeDoc(res, "dump.yaml", doc)
			}
			sum[i].elapsed += time.Since(t0)
			sum[i].cpu += cputime.Process() - c0
			peak[i] = max(peak[i], stop())
			if err != nil || len(res.Cluster.Pods) != clustergen.Scale.Pods || len(res.Dropped) > 0 {
				b.Fatalf("%s: %v: %d pods, dropped %v", how, err, len(res.Cluster.Pods), res.Dropped)
			}
		}
	}
	for i, how := range []string{"batches", "whole"} {
		b.ReportMetric(sum[i].elapsed.Seconds()/float64(b.N), how+"-s/op")
		b.ReportMetric(sum[i].cpu.Seconds()/float64(b.N), how+"-cpu-s/op")
		b.ReportMetric(float64(peak[i])/(1<<20), how+"-peak-MB")
	}
}
