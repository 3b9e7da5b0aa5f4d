package lab

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moat-net/moat/manifest"
)

// SnapshotFiles copies manifests into dir the way manifest.Loader reads
// them: files as given, directories recursively (*.yaml, *.yml, *.json),
// "-" from stdin. The copies are numbered so they load in the original
// order.
func SnapshotFiles(dir string, paths []string, stdin io.Reader) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	n := 0
	write := func(name string, r io.Reader) error {
		n++
		dst := filepath.Join(dir, fmt.Sprintf("%04d-%s", n, name))
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return fmt.Errorf("copy %s: %w", name, err)
		}
		return f.Close()
	}
	copyFile := func(p string) error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		name := filepath.Base(p)
		if !manifest.IsManifestName(name) {
			name += ".yaml"
		}
		return write(name, f)
	}
	for _, p := range paths {
		if p == "-" {
			if stdin == nil {
				stdin = os.Stdin
			}
			if err := write("stdin.yaml", stdin); err != nil {
				return err
			}
			continue
		}
		files, err := manifest.Files(nil, p)
		if err != nil {
			return err
		}
		for _, f := range files {
			if err := copyFile(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// SnapshotFS copies the manifests under root in fsys (the embedded
// examples) into dir.
func SnapshotFS(dir string, fsys fs.FS, root string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := manifest.Files(fsys, root)
	if err != nil {
		return err
	}
	for i, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%04d-%s", i+1, filepath.Base(f))), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
