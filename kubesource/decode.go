package kubesource

import (
	"bytes"
	"testing/fstest"

	"github.com/moat-net/moat/manifest"
)

// Decode turns the listed objects into the compiler's snapshot through
// the manifest decoder, the one files go through: the same strict decoding
// of policies (unknown and duplicate fields fail closed), the same
// diagnostics and the same Dropped list, which commands refuse to judge
// traffic with. Diagnostics name the source "cluster/<resource>".
func (s *Snapshot) Decode() (*manifest.Result, error) {
	fsys := fstest.MapFS{}
	var names []string
	for _, k := range Kinds {
		var items [][]byte
		for _, o := range s.Objects {
			if o.Kind == k.Kind {
				items = append(items, o.JSON)
			}
		}
		if len(items) == 0 {
			continue
		}
		name := "cluster/" + k.Resource
		doc := append([]byte(`{"apiVersion":"v1","kind":"List","items":[`), bytes.Join(items, []byte(","))...)
		fsys[name] = &fstest.MapFile{Data: append(doc, "]}"...)}
		names = append(names, name)
	}
	if len(names) == 0 {
		return &manifest.Result{}, nil
	}
	return (&manifest.Loader{FS: fsys}).Load(names...)
}
