// Package manifest reads Kubernetes manifests (files, directories, stdin;
// multi-document YAML, JSON, kind: List) into a policy.Cluster. It is the
// file source of Moat's data flow; the agent's informers are the other.
package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/policy"
)

// Result is what loading produced.
type Result struct {
	Cluster policy.Cluster
	// Diagnostics are problems found while decoding: unknown or duplicate
	// fields, duplicate objects, unusable values. Objects with such
	// problems are still loaded where possible so the compiler can fail
	// closed on them.
	Diagnostics []policy.Diagnostic
	// Dropped names objects that could not be loaded at all (wrong
	// apiVersion, undecodable). Leaving out a policy could widen access,
	// so commands that judge traffic refuse to run when this is not empty.
	Dropped []string
	// Skipped lists objects of kinds Moat does not read, for -v.
	Skipped []string
}

// Loader reads manifests. The zero value reads from the file system, with
// "-" meaning standard input.
type Loader struct {
	// Stdin is read for the path "-"; nil means os.Stdin.
	Stdin io.Reader
	// FS, if set, is used instead of the OS file system (embedded examples).
	FS fs.FS
}

// Load reads every path: files, directories (recursively, *.yaml, *.yml and
// *.json) or "-". Input that cannot be parsed at all is an error naming the
// file; everything else becomes a diagnostic.
func (l *Loader) Load(paths ...string) (*Result, error) {
	d := newDecoder()
	for _, p := range paths {
		if err := l.loadPath(d, p); err != nil {
			return nil, err
		}
	}
	return d.result(), nil
}

func (l *Loader) loadPath(d *decoder, p string) error {
	if p == "-" {
		in := l.Stdin
		if in == nil {
			in = os.Stdin
		}
		return d.decodeStream("<stdin>", in)
	}
	files, err := Files(l.FS, p)
	if err != nil {
		return err
	}
	for _, f := range files {
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
func (l *Loader) loadFile(d *decoder, p string) error {
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
	return d.decodeStream(p, f)
}

// decodeStream splits a YAML or JSON stream into documents.
func (d *decoder) decodeStream(name string, r io.Reader) error {
	reader := yaml.NewYAMLReader(bufio.NewReader(r))
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		js, err := sigsyaml.YAMLToJSONStrict(raw)
		if err != nil {
			return fmt.Errorf("%s: document %d: invalid YAML: %w", name, doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		if err := d.decodeObject(fmt.Sprintf("%s#%d", name, doc), js); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' || bytes.Equal(t, []byte("---")) {
			continue
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	return out
}
