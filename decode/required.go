package decode

import (
	"sync"
)

//go:generate go test -run TestRequiredTableUpToDate -update .

// resolved caches, per schema location, the schema with the CRD's
// required members set.
var resolved sync.Map // string -> *schema

// requiredSchema returns base with the members crdRequired lists for the
// schema location at (e.g. "spec.ingress[]"), set as required.
func requiredSchema(base *schema, at string) *schema {
	if s, ok := resolved.Load(at); ok {
		return s.(*schema)
	}
	s := &schema{fields: base.fields}
	for _, name := range crdRequired[at] {
		i := -1
		for j, f := range base.fields {
			if f == name {
				i = j
			}
		}
		if i < 0 {
			// The CRD requires a field the decoder does not know: it is
			// unknown wherever it appears, so the policy fails closed
			// anyway; TestRequiredFieldsKnown catches this.
			continue
		}
		s.required |= 1 << i
	}
	resolved.Store(at, s)
	return s
}
