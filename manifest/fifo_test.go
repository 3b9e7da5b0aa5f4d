package manifest_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moat-net/moat/manifest"
)

// A List read through a named pipe (-f <(kubectl get -A -o yaml), or -f
// /dev/stdin of a pipe) is read as from a regular file: a pipe cannot be
// read again at an offset, so its items are held as stdin's are, instead
// of read again (which failed: "illegal seek").
func TestLoadListFromPipe(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nitems:\n")
	for _, ns := range []string{"a", "b", "c"} {
		b.WriteString("- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: " + ns + "\n")
	}
	b.WriteString("kind: List\nmetadata:\n  resourceVersion: \"\"\n")
	doc := b.String()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "dump.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(doc)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		done <- err
	}()
	res, err := (&manifest.Loader{}).Load(fifo)
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatalf("through a pipe: %v", err)
	}
	if len(res.Cluster.Namespaces) != 3 || len(res.Dropped) > 0 {
		t.Fatalf("through a pipe: namespaces %v, dropped %v; want 3 namespaces", res.Cluster.Namespaces, res.Dropped)
	}
}
