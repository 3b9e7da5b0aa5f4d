package v1alpha2_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/deploy"
)

// loadCRD reads the embedded CRD bundle of a channel, requires exactly one
// document, and decodes it strictly as apiextensions.k8s.io/v1.
func loadCRD(t *testing.T, channel deploy.Channel) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := deploy.CRDs(channel)
	if err != nil {
		t.Fatalf("deploy.CRDs(%q): %v", channel, err)
	}
	docs := splitYAML(t, data)
	if len(docs) != 1 {
		t.Fatalf("%s channel: %d YAML documents, want exactly one CRD", channel, len(docs))
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(docs[0], crd); err != nil {
		t.Fatalf("%s channel: decode as apiextensions/v1 CRD: %v", channel, err)
	}
	return crd
}

func splitYAML(t *testing.T, data []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("split YAML: %v", err)
		}
		// Skip documents holding only comments and separators.
		for _, line := range strings.Split(string(doc), "\n") {
			if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") && s != "---" {
				docs = append(docs, doc)
				break
			}
		}
	}
}

// toInternal converts a v1 CRD to the internal form the API server
// validates.
func toInternal(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) *apiextensions.CustomResourceDefinition {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiextensions.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	internal := &apiextensions.CustomResourceDefinition{}
	if err := scheme.Convert(crd, internal, nil); err != nil {
		t.Fatalf("convert CRD to internal: %v", err)
	}
	return internal
}

// validateCRD runs the API server's create-time validation of a CRD:
// structural schema, CEL compilation and cost limits, list types, names.
func validateCRD(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) field.ErrorList {
	t.Helper()
	internal := toInternal(t, crd)
	// On create the API server records the storage version before it
	// validates (the CRD strategy's PrepareForCreate); do the same.
	for _, v := range internal.Spec.Versions {
		if v.Storage {
			internal.Status.StoredVersions = append(internal.Status.StoredVersions, v.Name)
		}
	}
	return crdvalidation.ValidateCustomResourceDefinition(context.Background(), internal)
}

// admitter checks custom objects the way the API server does on create:
// prune unknown fields, then OpenAPI schema validation, list-type
// validation and CEL rules.
type admitter struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

func newAdmitter(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) *admitter {
	t.Helper()
	internal := toInternal(t, crd)
	// The internal form hoists a schema shared by all versions to
	// spec.validation.
	validation := internal.Spec.Validation
	if len(internal.Spec.Versions) == 1 && internal.Spec.Versions[0].Schema != nil {
		validation = internal.Spec.Versions[0].Schema
	}
	if validation == nil || validation.OpenAPIV3Schema == nil {
		t.Fatalf("CRD has no OpenAPI schema")
	}
	props := validation.OpenAPIV3Schema
	s, err := structuralschema.NewStructural(props)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		t.Fatalf("schema validator: %v", err)
	}
	return &admitter{structural: s, schema: sv, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}
}

// admit returns the fields the API server would prune and the errors it
// would report for obj (a decoded JSON object).
func (a *admitter) admit(obj map[string]any) (pruned []string, errs field.ErrorList) {
	pruned = pruning.PruneWithOptions(obj, a.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, a.schema)...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, a.structural, obj)...)
	celErrs, _ := a.cel.Validate(context.Background(), nil, a.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	errs = append(errs, celErrs...)
	return pruned, errs
}

// schemaAt walks a dotted path through properties; "[]" steps into array
// items, e.g. "spec.ingress[].from[].networks".
func schemaAt(t *testing.T, root *apiextensionsv1.JSONSchemaProps, path string) (*apiextensionsv1.JSONSchemaProps, bool) {
	t.Helper()
	cur := root
	for _, part := range strings.Split(path, ".") {
		name, items := strings.CutSuffix(part, "[]")
		next, ok := cur.Properties[name]
		if !ok {
			return nil, false
		}
		cur = &next
		if items {
			if cur.Items == nil || cur.Items.Schema == nil {
				t.Fatalf("%s: %s is not an array with an item schema", path, name)
			}
			cur = cur.Items.Schema
		}
	}
	return cur, true
}
