package lab

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/moat-net/moat/manifest"
)

// Manifests returns a function that copies manifests into a directory the
// way manifest.Loader reads them, for Options.Snapshot and Apply: each
// path is a file or a directory (recursive: *.yaml, *.yml, *.json) in
// fsys, or in the file system when fsys is nil, where "-" is stdin (read
// from its start again if it can seek, so the input a command compiled
// can be copied afterwards). The copies are numbered so they load in the
// original order.
func Manifests(fsys fs.FS, stdin io.Reader, paths ...string) func(dir string) error {
	return func(dir string) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		n := 0
		write := func(name string, r io.Reader) error {
			n++
			if !manifest.IsManifestName(name) {
				name += ".yaml"
			}
			dst := filepath.Join(dir, fmt.Sprintf("%04d-%s", n, filepath.Base(name)))
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
		open := func(p string) (io.ReadCloser, error) {
			if fsys != nil {
				return fsys.Open(p)
			}
			return os.Open(p)
		}
		copied := map[string]bool{} // a file named twice is read once
		for _, p := range paths {
			if p == "-" && fsys == nil {
				if s, ok := stdin.(io.Seeker); ok {
					if _, err := s.Seek(0, io.SeekStart); err != nil {
						return fmt.Errorf("read stdin again: %w", err)
					}
				}
				if err := write("stdin.yaml", stdin); err != nil {
					return err
				}
				continue
			}
			files, err := manifest.Files(fsys, p)
			if err != nil {
				return err
			}
			for _, file := range files {
				k := manifest.Key(fsys, file)
				if copied[k] {
					continue
				}
				copied[k] = true
				f, err := open(file)
				if err != nil {
					return err
				}
				err = write(file, f)
				f.Close()
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
}
