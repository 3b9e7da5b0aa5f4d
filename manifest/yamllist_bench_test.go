package manifest

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/cputime"
	"github.com/moat-net/moat/internal/peakheap"
)

// BenchmarkYAMLList reads the 10k-pod cluster as `kubectl get -A -o yaml`
// prints it (one List document, 47 MB) from a file three ways: as the
// loader reads a file (the items read again from it a batch at a time,
// not held), in batches with the document's text held (as decodeYAML
// reads stdin) and whole (how every document was read before: wholeDoc),
// the three alternating in every iteration: elapsed time, CPU time (all
// threads) and peak heap of each (peakheap: heap objects, garbage not yet
// swept included, so up to the collector's goal, which follows what else
// the process holds: moat check's maxrss says more, see BENCHMARKS.md).
// start-MB is the most that was live before a read (the benchmark holds
// nothing of the dump between reads).
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
	path := filepath.Join(b.TempDir(), "dump.yaml")
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(doc)))
	doc = nil
	type figures struct{ elapsed, cpu time.Duration }
	modes := []string{"file", "batches", "whole"}
	var sum [3]figures
	var peak [3]uint64
	var start uint64
	for b.Loop() {
		for i, how := range modes {
			runtime.GC()
			start = max(start, liveHeap())
			stop := peakheap.Start()
			t0, c0 := time.Now(), cputime.Process()
			res := &decode.Result{}
			var err error
			switch how {
			case "file":
				err = readFile(res, path, true)
			case "batches":
				err = readFile(res, path, false)
			default:
				var raw []byte
				if raw, err = os.ReadFile(path); err == nil {
					err = wholeDoc(res, "dump.yaml", raw)
				}
			}
			sum[i].elapsed += time.Since(t0)
			sum[i].cpu += cputime.Process() - c0
			peak[i] = max(peak[i], stop())
			if err != nil || len(res.Cluster.Pods) != clustergen.Scale.Pods || len(res.Dropped) > 0 {
				b.Fatalf("%s: %v: %d pods, dropped %v", how, err, len(res.Cluster.Pods), res.Dropped)
			}
		}
	}
	for i, how := range modes {
		b.ReportMetric(sum[i].elapsed.Seconds()/float64(b.N), how+"-s/op")
		b.ReportMetric(sum[i].cpu.Seconds()/float64(b.N), how+"-cpu-s/op")
		b.ReportMetric(float64(peak[i])/(1<<20), how+"-peak-MB")
	}
	b.ReportMetric(float64(start)/(1<<20), "start-MB")
}

// readFile reads path as the loader reads a file (at), or as it reads
// stdin.
func readFile(res *decode.Result, path string, at bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if at {
		return decodeStream(res, "dump.yaml", f, f)
	}
	return decodeStream(res, "dump.yaml", f, nil)
}

// liveHeap is the live heap now (after a collection: what is held).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
