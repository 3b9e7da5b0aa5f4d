// Package manifest reads Kubernetes manifests (files, directories, stdin;
// multi-document YAML, JSON, kind: List) into a policy.Cluster. It is the
// file source of Moat's data flow; the agent's informers are the other.
// Both decode objects through package decode, so a file and the API server
// can never disagree about what a manifest means.
package manifest

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moat-net/moat/decode"
)

// Result is what loading produced: see decode.Result.
type Result = decode.Result

// Loader reads manifests. The zero value reads from the file system, with
// "-" meaning standard input.
type Loader struct {
	// Stdin is read for the path "-"; nil means os.Stdin.
	Stdin io.Reader
	// StdinCopy, if set, receives every byte read from Stdin, so that a
	// command can both load "-" and keep what it read (moat lab keeps a
	// copy of its input) without buffering stdin itself.
	StdinCopy io.Writer
	// FS, if set, is used instead of the OS file system (embedded examples).
	FS fs.FS
}

// Load reads every path: files, directories (recursively, *.yaml, *.yml and
// *.json) or "-". Input that cannot be parsed at all is an error naming the
// file; everything else becomes a diagnostic.
func (l *Loader) Load(paths ...string) (*Result, error) {
	res := &Result{}
	// A file named twice (-f dir -f dir/a.yaml, -f a -f a) is read once:
	// its objects are not duplicates of themselves.
	seen := map[string]bool{}
	for _, p := range paths {
		if err := l.loadPath(res, p, seen); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (l *Loader) loadPath(d *Result, p string, seen map[string]bool) error {
	if p == "-" {
		in := l.Stdin
		if in == nil {
			in = os.Stdin
		}
		if l.StdinCopy != nil {
			in = io.TeeReader(in, l.StdinCopy)
		}
		return decodeStream(d, "<stdin>", in)
	}
	files, err := Files(l.FS, p)
	if err != nil {
		return err
	}
	for _, f := range files {
		key := filepath.Clean(f)
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := l.loadFile(d, f); err != nil {
			return err
		}
	}
	return nil
}

// Files lists what Load reads for one path: the path itself when it is a
// file, or every *.yaml, *.yml and *.json below it when it is a directory,
// sorted. fsys nil means the OS file system. Tools that copy or watch
// manifests call it so they see exactly the files Load would.
func Files(fsys fs.FS, p string) ([]string, error) {
	var info fs.FileInfo
	var err error
	if fsys != nil {
		info, err = fs.Stat(fsys, p)
	} else {
		info, err = os.Stat(p)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	walk := func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.IsDir() && IsManifestName(path) {
			files = append(files, path)
		}
		return nil
	}
	if fsys != nil {
		err = fs.WalkDir(fsys, p, walk)
	} else {
		err = filepath.WalkDir(p, walk)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	sort.Strings(files)
	return files, nil
}

// IsManifestName reports whether a file name is one directories are read
// for: *.yaml, *.yml or *.json.
func IsManifestName(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}
func (l *Loader) loadFile(d *Result, p string) error {
	var f io.ReadCloser
	var err error
	if l.FS != nil {
		f, err = l.FS.Open(p)
	} else {
		f, err = os.Open(p)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	return decodeStream(d, p, f)
}
