package manifest_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/manifest"
)

// BenchmarkLoadYAML loads the 10k-pod cluster as multi-document YAML (the
// API server's objects, managedFields included, one document each), as
// `moat explain -f cluster.yaml` does: each document is converted to JSON
// and decoded. It says how much slower YAML is than JSON (see
// BenchmarkLoadJSON, same objects).
//
//	go test -run '^$' -bench 'BenchmarkLoad' -benchtime 3x ./manifest/
func BenchmarkLoadYAML(b *testing.B) {
	js := dumpJSON(b)
	var list struct{ Items []json.RawMessage }
	if err := json.Unmarshal(js, &list); err != nil {
		b.Fatal(err)
	}
	var y bytes.Buffer
	for _, item := range list.Items {
		doc, err := yaml.JSONToYAML(item)
		if err != nil {
			b.Fatal(err)
		}
		y.WriteString("---\n")
		y.Write(doc)
	}
	path := filepath.Join(b.TempDir(), "cluster.yaml")
	if err := os.WriteFile(path, y.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	load(b, path, int64(y.Len()))
}

// BenchmarkLoadJSON loads the same objects as one JSON List.
func BenchmarkLoadJSON(b *testing.B) {
	js := dumpJSON(b)
	path := filepath.Join(b.TempDir(), "cluster.json")
	if err := os.WriteFile(path, js, 0o644); err != nil {
		b.Fatal(err)
	}
	load(b, path, int64(len(js)))
}

func dumpJSON(b *testing.B) []byte {
	var buf bytes.Buffer
	if err := clustergen.Generate(clustergen.Scale).WriteJSON(&buf, clustergen.APIServer); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

func load(b *testing.B, path string, size int64) {
	b.SetBytes(size)
	for b.Loop() {
		res, err := (&manifest.Loader{}).Load(path)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Cluster.Pods) != clustergen.Scale.Pods || len(res.Dropped) > 0 {
			b.Fatalf("%d pods, dropped %v", len(res.Cluster.Pods), res.Dropped)
		}
	}
}
