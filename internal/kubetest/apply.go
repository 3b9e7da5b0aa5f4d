package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// FieldManager is the server-side apply manager name the harness uses.
const FieldManager = "moat-kubetest"

// DecodeYAML splits a YAML stream into objects. Empty documents are dropped;
// a document without apiVersion or kind is an error naming its position.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []*unstructured.Unstructured
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, u)
	}
}

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// DryRun asks the server to validate, default and admit each object
	// without storing it.
	DryRun bool
}

// Apply sends each object to the server with server-side apply (forcing
// ownership, strict field validation), resolving kinds through the server's discovery so CRDs
// installed earlier are known. Namespaced objects must name their namespace.
func (e *Env) Apply(ctx context.Context, objs []*unstructured.Unstructured, o ApplyOptions) error {
	groups, err := restmapper.GetAPIGroupResources(e.Client.Discovery())
	if err != nil {
		return fmt.Errorf("discover API resources: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	force := true
	// Strict: a misspelt or unknown field is an error, not a warning.
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force, FieldValidation: "Strict"}
	if o.DryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		what := fmt.Sprintf("%s %q", gvk.Kind, obj.GetName())
		if obj.GetName() == "" {
			return fmt.Errorf("apply %s: metadata.name is required", gvk.Kind)
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("apply %s: %w", what, err)
		}
		res := e.Dynamic.Resource(m.Resource)
		var ri dynamic.ResourceInterface = res
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				return fmt.Errorf("apply %s: namespaced kind needs metadata.namespace", what)
			}
			ri = res.Namespace(obj.GetNamespace())
		} else if obj.GetNamespace() != "" {
			return fmt.Errorf("apply %s: cluster-scoped kind has metadata.namespace %q", what, obj.GetNamespace())
		}
		body, err := obj.MarshalJSON()
		if err != nil {
			return fmt.Errorf("apply %s: %w", what, err)
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, body, opts); err != nil {
			return fmt.Errorf("apply %s: %w", what, err)
		}
	}
	return nil
}
