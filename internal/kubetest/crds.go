package kubetest

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// crdWaitTimeout bounds the wait for one CRD to become Established and served.
const crdWaitTimeout = time.Minute

// InstallCRDs applies the CustomResourceDefinitions in yamls server-side
// (CRDs such as ClusterNetworkPolicy's are too large for client-side apply's
// annotation) and waits until each is Established and its versions appear
// in discovery, so objects of the new kinds can be created right away. Any
// document that is not an apiextensions.k8s.io/v1 CRD is an error.
func (e *Env) InstallCRDs(ctx context.Context, yamls ...[]byte) error {
	var crds []*unstructured.Unstructured
	for i, y := range yamls {
		objs, err := DecodeYAML(y)
		if err != nil {
			return fmt.Errorf("install CRDs: stream %d: %w", i+1, err)
		}
		for _, o := range objs {
			if o.GetAPIVersion() != "apiextensions.k8s.io/v1" || o.GetKind() != "CustomResourceDefinition" {
				return fmt.Errorf("install CRDs: stream %d: %s %s %q is not a CustomResourceDefinition", i+1, o.GetAPIVersion(), o.GetKind(), o.GetName())
			}
			crds = append(crds, o)
		}
	}
	if len(crds) == 0 {
		return fmt.Errorf("install CRDs: no CustomResourceDefinition given")
	}
	for _, crd := range crds {
		// Status in a manifest (controller-gen writes an empty one) is not ours to set.
		unstructured.RemoveNestedField(crd.Object, "status")
		if _, err := e.Dynamic.Resource(crdResource).Apply(ctx, crd.GetName(), crd, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			return fmt.Errorf("install CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := e.waitCRDServed(ctx, crd); err != nil {
			return err
		}
	}
	return nil
}

// waitCRDServed waits for the Established condition, then for every served
// version's resource to be listed by discovery.
func (e *Env) waitCRDServed(ctx context.Context, crd *unstructured.Unstructured) error {
	ctx, cancel := context.WithTimeout(ctx, crdWaitTimeout)
	defer cancel()
	name := crd.GetName()
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")

	err := poll(ctx, func() (bool, error) {
		got, err := e.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return conditionTrue(got, "Established"), nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not Established: %w", name, err)
	}
	for _, v := range versions {
		vm, _ := v.(map[string]any)
		served, _ := vm["served"].(bool)
		version, _ := vm["name"].(string)
		if !served {
			continue
		}
		gv := group + "/" + version
		err := poll(ctx, func() (bool, error) {
			list, err := e.Client.Discovery().ServerResourcesForGroupVersion(gv)
			if err != nil {
				return false, nil // not yet in discovery
			}
			return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == plural }), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s: %s %s not served: %w", name, gv, plural, err)
		}
	}
	return nil
}

func conditionTrue(obj *unstructured.Unstructured, condType string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == condType && cm["status"] == "True" {
			return true
		}
	}
	return false
}

// poll calls f every pollInterval until it reports done, returns an error,
// or ctx ends.
func poll(ctx context.Context, f func() (bool, error)) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		done, err := f()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
