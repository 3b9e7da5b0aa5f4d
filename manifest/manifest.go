// Package manifest reads Kubernetes manifests (files, directories, stdin;
// multi-document YAML, JSON, kind: List) into a policy.Cluster. It is the
// file source of Moat's data flow; the agent's informers are the other.
// Both decode objects through package decode, so a file and the API server
// can never disagree about what a manifest means.
package manifest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
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
	// Namespace and EnforceNamespace place namespaced objects without a
	// namespace as kubectl apply does (see decode.Result): Namespace is
	// that of -n or of the kubeconfig context, "" for "default";
	// EnforceNamespace (-n) refuses objects naming another one.
	Namespace        string
	EnforceNamespace bool
}

// Load reads every path: files, directories (recursively, *.yaml, *.yml and
// *.json, following symbolic links) or "-". Input that cannot be parsed at
// all is an error naming the file; everything else becomes a diagnostic.
// A path that holds no Kubernetes object (an empty directory, a directory
// without manifests, a file of comments) is an error too: every command
// that reads manifests would otherwise judge a smaller input than the one
// named, and a gate such as moat diff --after would pass a change it never
// read.
func (l *Loader) Load(paths ...string) (*Result, error) {
	res := &Result{Namespace: l.Namespace, EnforceNamespace: l.EnforceNamespace}
	// A file named twice (-f dir -f dir/a.yaml, -f a -f $PWD/a, a link
	// and its target) is read once: its objects are not duplicates of
	// themselves. Keys are real paths; counts are the objects each file
	// held, so a path whose files were all read before is not empty.
	seen := map[string]int{}
	for _, p := range paths {
		if err := l.loadPath(res, p, seen); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// objects counts the objects a result holds, read or not.
func objects(r *Result) int {
	c := &r.Cluster
	return len(c.Pods) + len(c.Namespaces) + len(c.Nodes) + len(c.NetworkPolicies) + len(c.ClusterNetworkPolicies) + len(r.Skipped) + len(r.Dropped)
}

func (l *Loader) loadPath(d *Result, p string, seen map[string]int) error {
	if p == "-" {
		in := l.Stdin
		if in == nil {
			in = os.Stdin
		}
		if l.StdinCopy != nil {
			in = io.TeeReader(in, l.StdinCopy)
		}
		before := objects(d)
		if err := decodeStream(d, "<stdin>", in, nil); err != nil {
			return err
		}
		if objects(d) == before {
			return errors.New("no Kubernetes objects in - (standard input)")
		}
		return nil
	}
	files, err := l.files(p)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no Kubernetes objects in %s: a directory without *.yaml, *.yml or *.json files", p)
	}
	held := 0
	for _, f := range files {
		if n, ok := seen[f.key]; ok {
			held += n
			continue
		}
		before := objects(d)
		if err := l.loadFile(d, f.path); err != nil {
			return err
		}
		seen[f.key] = objects(d) - before
		held += seen[f.key]
	}
	if held == 0 {
		if len(files) == 1 && files[0].path == p {
			return fmt.Errorf("no Kubernetes objects in %s", p)
		}
		return fmt.Errorf("no Kubernetes objects in %s (%d manifest files, none holds one)", p, len(files))
	}
	return nil
}

// file is one manifest file: the path it is read by, and its identity
// (its real path) for telling two spellings of it apart from two files.
type file struct{ path, key string }

func (l *Loader) files(p string) ([]file, error) {
	if l.FS != nil {
		names, err := fsFiles(l.FS, p)
		if err != nil {
			return nil, err
		}
		out := make([]file, len(names))
		for i, n := range names {
			out[i] = file{n, path.Clean(n)}
		}
		return out, nil
	}
	return osFiles(p)
}

// Files lists what Load reads for one path: the path itself when it is a
// file, or every *.yaml, *.yml and *.json below it when it is a directory,
// each file once, sorted. fsys nil means the OS file system, where
// symbolic links are followed: a link to a directory (given as p, or
// inside one) is read as that directory, a link to a file as that file,
// and a file reached by two paths (a ConfigMap volume's key links and its
// ..data directory) is listed once, by the path outside the directories
// whose name starts with ".." (kubelet's). Tools that copy or watch
// manifests call it so they see exactly the files Load would.
func Files(fsys fs.FS, p string) ([]string, error) {
	if fsys != nil {
		return fsFiles(fsys, p)
	}
	files, err := osFiles(p)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.path
	}
	return out, nil
}

// Key is the identity of a file path for de-duplication: its absolute
// real path (links resolved) in the OS file system, the cleaned path in
// fsys.
func Key(fsys fs.FS, p string) string {
	if fsys != nil {
		return path.Clean(p)
	}
	return realPath(p)
}

func realPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

// globFiles reads a path that does not exist as a pattern, as kubectl -f
// does (`-f 'dir/*.yaml'`, quoted so that the shell leaves it): each
// match as if named on its own. No match is an error, as with kubectl.
func globFiles(pattern string) ([]file, error) {
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("read %s: pattern: %w", pattern, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("read %s: no such file or directory, and no path matches it as a pattern", pattern)
	}
	var files []file
	for _, m := range matches {
		if _, err := os.Stat(m); err != nil {
			return nil, fmt.Errorf("read %s: %w", m, err) // a dangling link: not a pattern again
		}
		f, err := osFiles(m)
		if err != nil {
			return nil, err
		}
		files = append(files, f...)
	}
	return files, nil
}

// fsFiles is Files in an fs.FS (embedded examples: no links).
func fsFiles(fsys fs.FS, p string) ([]string, error) {
	info, err := fs.Stat(fsys, p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = fs.WalkDir(fsys, p, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.IsDir() && IsManifestName(path) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	sort.Strings(files)
	return files, nil
}

// osFiles is Files in the OS file system. filepath.WalkDir does not follow
// links, not even the root's, so a linked directory would be read as
// nothing at all; the walk here follows them (kubectl -f reads a link to
// a file, fails on a link to a directory given as the path, and skips
// links to directories inside one: Moat reads what they point at, since a
// manifest left out silently could pass a change unread). A directory
// already on the way down (a link loop) is not entered again.
func osFiles(p string) ([]file, error) {
	if strings.HasPrefix(p, "http://") || strings.HasPrefix(p, "https://") {
		return nil, fmt.Errorf("read %s: a URL (kubectl -f fetches it; moat reads files only: download it first, e.g. curl -fsSLO %s)", p, p)
	}
	info, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) && strings.ContainsAny(p, "*?[") {
		return globFiles(p)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if !info.IsDir() {
		return []file{{p, realPath(p)}}, nil
	}
	var files []file
	var walk func(dir string, up map[string]bool) error
	walk = func(dir string, up map[string]bool) error {
		real := realPath(dir)
		if up[real] {
			return nil
		}
		up[real] = true
		defer delete(up, real)
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := filepath.Join(dir, e.Name())
			isDir := e.IsDir()
			if e.Type()&fs.ModeSymlink != 0 {
				fi, err := os.Stat(name)
				if err != nil {
					if IsManifestName(name) {
						return err // a dangling link named like a manifest
					}
					continue
				}
				isDir = fi.IsDir()
			}
			switch {
			case isDir:
				if err := walk(name, up); err != nil {
					return err
				}
			case IsManifestName(name):
				files = append(files, file{name, realPath(name)})
			}
		}
		return nil
	}
	if err := walk(p, map[string]bool{}); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	// Sorted by path, with paths through kubelet's ".."-named directories
	// after the others, so that a file reached both ways keeps the name
	// the user sees.
	sort.SliceStable(files, func(i, j int) bool {
		hi, hj := hiddenByKubelet(files[i].path), hiddenByKubelet(files[j].path)
		if hi != hj {
			return hj
		}
		return files[i].path < files[j].path
	})
	kept := files[:0]
	have := map[string]bool{}
	for _, f := range files {
		if !have[f.key] {
			have[f.key] = true
			kept = append(kept, f)
		}
	}
	return kept, nil
}

// hiddenByKubelet reports whether a path goes through a directory whose
// name starts with "..": kubelet's names in ConfigMap and Secret volumes
// (..data, ..2026_11_26_00_00_00.000), which no key may start with.
func hiddenByKubelet(p string) bool {
	for _, part := range strings.Split(filepath.ToSlash(p), "/") {
		if strings.HasPrefix(part, "..") && part != ".." {
			return true
		}
	}
	return false
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
	var f fs.File
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
	return decodeStream(d, p, f, rereadable(f))
}

// rereadable returns f as an io.ReaderAt when it is a regular file, which
// a file opened here is read from its start: its List items can then be
// read again at their offsets instead of held. A pipe (-f <(kubectl get
// ...), -f /dev/stdin of a pipe) has a ReadAt that fails: nil.
func rereadable(f fs.File) io.ReaderAt {
	at, ok := f.(io.ReaderAt)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil
	}
	return at
}
