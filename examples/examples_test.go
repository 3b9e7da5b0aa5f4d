package examples_test

import (
	"bytes"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

var update = flag.Bool("update", false, "rewrite matrix.golden files")

// invalid lists the examples that are invalid on purpose.
var invalid = map[string]bool{"unknown-field-fail-closed": true}

// TestExamplesMatchGolden computes each example's matrix with the
// arguments in its matrix.args and compares the table with matrix.golden.
func TestExamplesMatchGolden(t *testing.T) {
	dirs, err := fs.Glob(examples.FS, "*/matrix.args")
	if err != nil || len(dirs) < 10 {
		t.Fatalf("found %d examples (%v), want at least 10", len(dirs), err)
	}
	for _, argsFile := range dirs {
		name := filepath.Dir(argsFile)
		t.Run(name, func(t *testing.T) {
			args, err := examples.ReadArgs(name)
			if err != nil {
				t.Fatal(err)
			}
			gates, err := args.Gates()
			if err != nil {
				t.Fatal(err)
			}
			l := manifest.Loader{FS: examples.FS}
			res, err := l.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Dropped) > 0 {
				t.Fatalf("objects not loaded: %v", res.Diagnostics)
			}
			prog := policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: gates.Enabled(features.IngressNetworksAndNodes)})
			errs := 0
			for _, d := range append(res.Diagnostics, prog.Diagnostics...) {
				if d.Severity == policy.SeverityError {
					errs++
				}
			}
			if invalid[name] != (errs > 0) {
				t.Errorf("example has %d validation errors; invalid on purpose: %v; diagnostics: %v", errs, invalid[name], prog.Diagnostics)
			}
			m, err := matrix.Build(prog, args.Matrix)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := matrix.WriteTable(&got, m); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join(name, "matrix.golden")
			if *update {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./examples/ -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("matrix differs from %s\ngot:\n%s\nwant:\n%s", golden, got.String(), want)
			}
		})
	}
}
