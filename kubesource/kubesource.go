// Package kubesource reads the snapshot Moat judges from a live cluster: it
// lists Namespaces, Nodes, Pods, NetworkPolicies and ClusterNetworkPolicies
// through the API server, page by page as kubectl does, and decodes every
// listed object as raw JSON through the same strict decoder as manifest
// files, so an object written for a newer API fails closed here exactly as
// it does in a file. It is the live-cluster source of Moat's data flow
// (manifest files are the other); nothing downstream reaches back into it.
package kubesource

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultPageSize is how many objects one list request asks for, as
// kubectl get's --chunk-size.
const DefaultPageSize = 500

// Kind is one kind of object Moat reads from the API server.
type Kind struct {
	Kind       string
	APIVersion string
	// Resource is the API's plural name, as kubectl get takes it.
	Resource string
	// Path lists every object of the kind, cluster-wide.
	Path string
	// FieldSelector, if set, narrows the list on the server.
	FieldSelector string
	// Optional kinds may not be served (their CRD is not installed): then
	// none exist, which is reported rather than failed.
	Optional bool
}

// Kinds are what a snapshot holds, in the order they are listed.
var Kinds = []Kind{
	{Kind: "Namespace", APIVersion: "v1", Resource: "namespaces", Path: "/api/v1/namespaces"},
	{Kind: "Node", APIVersion: "v1", Resource: "nodes", Path: "/api/v1/nodes"},
	// Finished pods are left out as the agent leaves them out: their
	// addresses may already belong to another pod.
	{Kind: "Pod", APIVersion: "v1", Resource: "pods", Path: "/api/v1/pods", FieldSelector: "status.phase!=Succeeded,status.phase!=Failed"},
	{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Resource: "networkpolicies", Path: "/apis/networking.k8s.io/v1/networkpolicies"},
	{Kind: "ClusterNetworkPolicy", APIVersion: "policy.networking.k8s.io/v1alpha2", Resource: "clusternetworkpolicies", Path: "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies", Optional: true},
}

// Object is one listed object: its identity and its JSON exactly as the
// server sent it, with apiVersion and kind filled in (list items lack
// them).
type Object struct {
	Kind, Namespace, Name string
	JSON                  json.RawMessage
}

// Snapshot is everything listed from one API server.
type Snapshot struct {
	// Host is the server's URL.
	Host string
	// Objects are grouped by kind in the order of Kinds.
	Objects []Object
	// Count is the number of objects per kind.
	Count map[string]int
	// NotServed names the optional kinds the server does not serve.
	NotServed []string
}

// Options tune List.
type Options struct {
	// PageSize is the limit of each list request; 0 means
	// DefaultPageSize.
	PageSize int64
}

// List reads every object of Kinds from the server cfg points at. Any
// failure other than an optional kind not being served is an error: a
// snapshot missing some policies could widen access.
func List(ctx context.Context, cfg *rest.Config, opts Options) (*Snapshot, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	rc := cs.CoreV1().RESTClient()
	size := opts.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	snap := &Snapshot{Host: cfg.Host, Count: map[string]int{}}
	for _, k := range Kinds {
		objs, err := listKind(ctx, rc, k, size)
		if k.Optional && apierrors.IsNotFound(err) {
			snap.NotServed = append(snap.NotServed, k.Kind)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s from %s: %w", k.Kind, cfg.Host, err)
		}
		snap.Objects = append(snap.Objects, objs...)
		snap.Count[k.Kind] = len(objs)
	}
	return snap, nil
}

// listPage is the part of a list response List reads.
type listPage struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// listKind reads one kind page by page. When the continue token expires
// between pages (410 Gone), it starts over with one unpaginated list, as
// client-go's pager does, so the result is one consistent snapshot.
func listKind(ctx context.Context, rc rest.Interface, k Kind, size int64) ([]Object, error) {
	objs, err := listPages(ctx, rc, k, size)
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return listPages(ctx, rc, k, 0)
	}
	return objs, err
}

func listPages(ctx context.Context, rc rest.Interface, k Kind, size int64) ([]Object, error) {
	var out []Object
	token := ""
	for {
		req := rc.Get().AbsPath(k.Path).SetHeader("Accept", "application/json")
		if size > 0 {
			req = req.Param("limit", strconv.FormatInt(size, 10))
		}
		if token != "" {
			req = req.Param("continue", token)
		}
		if k.FieldSelector != "" {
			req = req.Param("fieldSelector", k.FieldSelector)
		}
		res := req.Do(ctx)
		if err := res.Error(); err != nil {
			// Error, unlike Raw, reads the server's Status (reason,
			// message).
			return nil, err
		}
		body, err := res.Raw()
		if err != nil {
			return nil, err
		}
		var page listPage
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("decode list response: %w", err)
		}
		for i, item := range page.Items {
			o, err := objectOf(k, item)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", len(out)+i, err)
			}
			out = append(out, o)
		}
		token = page.Metadata.Continue
		if token == "" || size == 0 {
			return out, nil
		}
	}
}

// objectOf names a list item and gives it the apiVersion and kind of its
// list, which the server leaves out of items.
func objectOf(k Kind, item json.RawMessage) (Object, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(item, &fields); err != nil {
		return Object{}, fmt.Errorf("not a JSON object: %w", err)
	}
	var meta struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	if m, ok := fields["metadata"]; ok {
		// A metadata the server sent in another shape is the decoder's
		// to report; the name is only for messages here.
		_ = json.Unmarshal(m, &meta)
	}
	o := Object{Kind: k.Kind, Namespace: meta.Namespace, Name: meta.Name, JSON: item}
	_, hasKind := fields["kind"]
	_, hasVersion := fields["apiVersion"]
	if hasKind && hasVersion {
		return o, nil
	}
	kind, _ := json.Marshal(k.Kind)
	version, _ := json.Marshal(k.APIVersion)
	fields["kind"], fields["apiVersion"] = kind, version
	js, err := json.Marshal(fields)
	if err != nil {
		return Object{}, err
	}
	o.JSON = js
	return o, nil
}
