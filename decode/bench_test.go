package decode

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/cputime"
)

// The decode benchmarks read a dump of a generated cluster as `kubectl get
// -A -o json` prints it (clustergen.Kubectl) or as the API server lists it
// (clustergen.APIServer), from a file, and report MB/s of JSON (go test's
// MB/s column), objects per second and the peak RSS of the decoding. The
// dumps are written once to the temporary directory and reused.
//
//	go test -run '^$' -bench 'BenchmarkDecode/' -benchtime 3x ./decode/

// Scale100k is the large cluster: 100,000 pods in 10,000
// namespaces on 1,000 nodes, 70,000 NetworkPolicies and 5,000
// ClusterNetworkPolicies.
var scale100k = clustergen.Config{Nodes: 1000, Namespaces: 10000, Pods: 100000, NetworkPolicies: 70000, ClusterPolicies: 5000, Seed: 1}

var benchClusters = []struct {
	name string
	cfg  clustergen.Config
}{
	{"pods=10k", clustergen.Scale},
	{"pods=100k", scale100k},
}

// dumpVersion changes when WriteJSON's output does, so stale dumps are
// not reused.
const dumpVersion = 1

// dump returns the path of the cluster's dump in style, writing it if
// needed.
func dump(b *testing.B, cfg clustergen.Config, style clustergen.JSONStyle) (string, int64) {
	b.Helper()
	name := fmt.Sprintf("moat-decode-bench-v%d-%d-%d-%d-%d-%d-%d-%s.json", dumpVersion, cfg.Nodes, cfg.Namespaces, cfg.Pods, cfg.NetworkPolicies, cfg.ClusterPolicies, cfg.Seed, style)
	path := filepath.Join(os.TempDir(), name)
	if st, err := os.Stat(path); err == nil {
		return path, st.Size()
	}
	tmp, err := os.CreateTemp(os.TempDir(), name+".*")
	if err != nil {
		b.Fatal(err)
	}
	if err := clustergen.Generate(cfg).WriteJSON(tmp, style); err != nil {
		b.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return path, st.Size()
}

// cpuTime returns a function giving the CPU time (user and system, all
// threads: decoding, reading ahead, garbage collection) this process used
// since, in milliseconds. On a machine shared with other work it varies
// far less than the elapsed time, so it is the figure to compare designs
// by.
func cpuTime() func() float64 {
	start := cputime.Process()
	return func() float64 { return float64(cputime.Process()-start) / 1e6 }
}

// BenchmarkDecode decodes the dumps with DecodeJSON, as `moat explain -f`
// does.
func BenchmarkDecode(b *testing.B) {
	for _, c := range benchClusters {
		for _, style := range []clustergen.JSONStyle{clustergen.Kubectl, clustergen.APIServer} {
			b.Run(fmt.Sprintf("%s/%s", c.name, style), func(b *testing.B) {
				path, size := dump(b, c.cfg, style)
				b.SetBytes(size)
				objects := c.cfg.Pods + c.cfg.Nodes + c.cfg.Namespaces + c.cfg.NetworkPolicies + c.cfg.ClusterPolicies
				peak := measurePeakRSS(b)
				cpu := cpuTime()
				for b.Loop() {
					f, err := os.Open(path)
					if err != nil {
						b.Fatal(err)
					}
					var r Result
					if err := r.DecodeJSON(path, f); err != nil {
						b.Fatal(err)
					}
					f.Close()
					if len(r.Cluster.Pods) != c.cfg.Pods || len(r.Dropped) > 0 {
						b.Fatalf("%d pods, dropped %v", len(r.Cluster.Pods), r.Dropped)
					}
				}
				b.ReportMetric(float64(objects)*float64(b.N)/b.Elapsed().Seconds(), "objects/s")
				b.ReportMetric(peak(), "peak-RSS-MiB")
				b.ReportMetric(cpu()/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// measurePeakRSS frees what setting up the benchmark used, resets the
// kernel's high-water mark of this process's resident memory, and returns
// a function reading it (MiB): the peak of the decoding alone, garbage
// collector headroom included. It reports 0 where /proc cannot do this.
func measurePeakRSS(b *testing.B) func() float64 {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the RSS high-water mark: %v", err)
		return func() float64 { return 0 }
	}
	return func() float64 {
		f, err := os.Open("/proc/self/status")
		if err != nil {
			return 0
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				return kb / 1024
			}
		}
		return 0
	}
}

// BenchmarkSkip is the floor of decoding: the scanner checking the syntax
// of the whole kubectl dump of 10k pods from memory, keeping nothing.
func BenchmarkSkip(b *testing.B) {
	path, size := dump(b, clustergen.Scale, clustergen.Kubectl)
	js, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	for b.Loop() {
		s := newBytesScanner(js)
		if err := s.skip(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAlternatives measures, in the same run and on the same kubectl
// dump of 10k pods, the designs this package was chosen against:
//
//   - old: the decoder Moat had (the whole document in memory, items as
//     json.RawMessage, a header map per item, then sigs.k8s.io/json into
//     the full typed object, strictly for policies);
//   - jsontext: reading every token of the stream with
//     go-json-experiment's jsontext.Decoder and doing nothing else, the
//     floor of any decoder built on it.
func BenchmarkAlternatives(b *testing.B) {
	path, size := dump(b, clustergen.Scale, clustergen.Kubectl)
	b.Run("old", func(b *testing.B) {
		b.SetBytes(size)
		defer reportCPU(b)()
		for b.Loop() {
			js, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			if n := oldDecode(b, js); n != clustergen.Scale.Pods {
				b.Fatalf("%d pods", n)
			}
		}
	})
	b.Run("jsontext", func(b *testing.B) {
		b.SetBytes(size)
		defer reportCPU(b)()
		for b.Loop() {
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			d := jsontext.NewDecoder(f)
			n := 0
			for {
				if _, err := d.ReadToken(); err != nil {
					if err != io.EOF {
						b.Fatal(err)
					}
					break
				}
				n++
			}
			f.Close()
			if n < clustergen.Scale.Pods {
				b.Fatalf("%d tokens", n)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(size)
		defer reportCPU(b)()
		for b.Loop() {
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			var r Result
			if err := r.DecodeJSON(path, f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
}

func reportCPU(b *testing.B) func() {
	cpu := cpuTime()
	return func() { b.ReportMetric(cpu()/float64(b.N), "cpu-ms/op") }
}

// oldDecode is the decoding Moat had before this package, reduced to its
// cost: it returns the number of pods.
func oldDecode(b *testing.B, js []byte) int {
	var list struct{ Items []json.RawMessage }
	if err := json.Unmarshal(js, &list); err != nil {
		b.Fatal(err)
	}
	pods := 0
	for _, item := range list.Items {
		var head map[string]json.RawMessage
		if err := json.Unmarshal(item, &head); err != nil {
			b.Fatal(err)
		}
		var kind string
		_ = json.Unmarshal(head["kind"], &kind)
		var err error
		switch kind {
		case "Pod":
			var o corev1.Pod
			err = sigsjson.UnmarshalCaseSensitivePreserveInts(item, &o)
			pods++
		case "Node":
			var o corev1.Node
			err = sigsjson.UnmarshalCaseSensitivePreserveInts(item, &o)
		case "Namespace":
			var o corev1.Namespace
			err = sigsjson.UnmarshalCaseSensitivePreserveInts(item, &o)
		case "NetworkPolicy":
			var o networkingv1.NetworkPolicy
			_, err = sigsjson.UnmarshalStrict(item, &o, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		case "ClusterNetworkPolicy":
			var o v1alpha2.ClusterNetworkPolicy
			_, err = sigsjson.UnmarshalStrict(item, &o, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	return pods
}
