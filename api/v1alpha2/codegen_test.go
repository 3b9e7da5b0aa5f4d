package v1alpha2_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// generatedPaths are the outputs of hack/update-codegen.sh, relative to the
// repository root. Directories are compared file by file, both ways.
var generatedPaths = []string{
	"api/v1alpha2/zz_generated.deepcopy.go",
	"deploy/crds/standard",
	"deploy/crds/experimental",
	"api/client",
}

// TestGeneratedFilesUpToDate regenerates deepcopy, CRDs and the client code
// into a temporary directory with the pinned generators (built from
// hack/tools/go.mod via the module proxy) and fails if any committed file
// differs, is missing, or is left over.
func TestGeneratedFilesUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPING STALENESS CHECK of generated code (-short): it builds controller-gen and code-generator (30-60 s); CI runs it")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required to run hack/update-codegen.sh: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "update-codegen.sh"), "--out", out)
	cmd.Dir = root
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/update-codegen.sh --out %s: %v\n%s", out, err, log.String())
	}

	for _, rel := range generatedPaths {
		committed := listFiles(t, filepath.Join(root, rel))
		fresh := listFiles(t, filepath.Join(out, rel))
		if len(fresh) == 0 {
			t.Errorf("%s: the generator produced nothing", rel)
		}
		for _, f := range fresh {
			if !slices.Contains(committed, f) {
				t.Errorf("%s: generated but not committed", filepath.Join(rel, f))
				continue
			}
			want, err := os.ReadFile(filepath.Join(out, rel, f))
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, rel, f))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: stale", filepath.Join(rel, f))
			}
		}
		for _, f := range committed {
			if !slices.Contains(fresh, f) {
				t.Errorf("%s: committed but no longer generated", filepath.Join(rel, f))
			}
		}
	}
	if t.Failed() {
		t.Log("run hack/update-codegen.sh (make generate) and commit the result")
	}
}

// listFiles returns the regular files under path relative to it ("." for
// path itself when it is a file), sorted.
func listFiles(t *testing.T, path string) []string {
	t.Helper()
	info, err := os.Stat(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if !info.IsDir() {
		return []string{"."}
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(path, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", path, err)
	}
	slices.Sort(files)
	return files
}
