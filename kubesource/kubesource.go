// Package kubesource reads the snapshot Moat judges from a live cluster: it
// lists Namespaces, Nodes, Pods, NetworkPolicies and ClusterNetworkPolicies
// through the API server, page by page as kubectl does, and decodes every
// page as it streams in through the same strict decoder as manifest files
// (package decode), so an object written for a newer API fails closed here
// exactly as it does in a file. It is the live-cluster source of Moat's data flow
// (manifest files are the other); nothing downstream reaches back into it.
package kubesource

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/moat-net/moat/decode"
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

// Snapshot is everything listed from one API server, decoded.
type Snapshot struct {
	// Host is the server's URL.
	Host string
	// Result holds the decoded cluster, its diagnostics and the objects
	// that could not be decoded at all (commands refuse to judge traffic
	// without them), exactly as the file loader reports them.
	Result *decode.Result
	// Count is the number of objects of each kind decoded into Result.
	Count map[string]int
	// NotServed names the optional kinds the server does not serve.
	NotServed []string
}

// Options tune List.
type Options struct {
	// PageSize is the limit of each list request; 0 means
	// DefaultPageSize.
	PageSize int64
	// MaxPages bounds the pages of one list; 0 means DefaultMaxPages.
	MaxPages int
}

// List reads every object of Kinds from the server cfg points at, decoding
// each page as it streams in (nothing of a page is kept once decoded). Any
// failure other than an optional kind not being served is an error: a
// snapshot missing some policies could widen access. A page that is not a
// List of the kind is such a failure, and so is a list whose continue
// tokens do not move on. An optional kind is not served only when its
// list answers 404 and the API server's discovery does not list it (see
// discovered); a 404 that discovery contradicts or cannot confirm is an
// error. When a continue token expires between pages (410 Gone), List
// starts over with unpaginated lists, as client-go's pager falls back to
// one full list, so the result is still one consistent read of each kind.
func List(ctx context.Context, cfg *rest.Config, opts Options) (*Snapshot, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	size := opts.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	maxPages := opts.MaxPages
	if maxPages <= 0 {
		maxPages = DefaultMaxPages
	}
	snap, err := list(ctx, cs.CoreV1().RESTClient(), cfg.Host, size, maxPages)
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		snap, err = list(ctx, cs.CoreV1().RESTClient(), cfg.Host, 0, maxPages)
	}
	return snap, err
}

// list reads every kind with pages of size objects (0: one request each),
// at most maxPages of them per kind.
func list(ctx context.Context, rc rest.Interface, host string, size int64, maxPages int) (*Snapshot, error) {
	snap := &Snapshot{Host: host, Result: &decode.Result{}, Count: map[string]int{}}
	for _, k := range Kinds {
		before := kept(snap.Result, k.Kind)
		err := listPages(ctx, rc, snap.Result, k, size, maxPages)
		if k.Optional && apierrors.IsNotFound(err) {
			served, derr := discovered(ctx, rc, k)
			if derr != nil {
				return nil, fmt.Errorf("list %s from %s: %w; discovery: %w", k.Kind, host, err, derr)
			}
			if !served {
				snap.NotServed = append(snap.NotServed, k.Kind)
				continue
			}
			err = fmt.Errorf("%w, but discovery lists %s in %s", err, k.Resource, k.APIVersion)
		}
		if err != nil {
			return nil, fmt.Errorf("list %s from %s: %w", k.Kind, host, err)
		}
		snap.Count[k.Kind] = kept(snap.Result, k.Kind) - before
	}
	return snap, nil
}

// discovered asks API discovery whether the server serves k, after its
// list answered 404: a 404 alone may come from something in front of the
// server (an HTML page from a proxy that routes paths), and kube-apiserver
// answers a group it does not serve with an empty 404, no Status. The
// kind is served when the server's group list (/apis, an APIGroupList)
// holds k's group version and that version's resource list holds k's
// resource; an answer that is neither list is an error.
func discovered(ctx context.Context, rc rest.Interface, k Kind) (bool, error) {
	group, version, ok := strings.Cut(k.APIVersion, "/")
	if !ok {
		return true, nil // the core group is always served
	}
	var groups metav1.APIGroupList
	if err := getJSON(ctx, rc, "/apis", "APIGroupList", &groups); err != nil {
		return false, err
	}
	i := slices.IndexFunc(groups.Groups, func(g metav1.APIGroup) bool {
		return g.Name == group && slices.ContainsFunc(g.Versions, func(v metav1.GroupVersionForDiscovery) bool { return v.Version == version })
	})
	if i < 0 {
		return false, nil
	}
	var resources metav1.APIResourceList
	if err := getJSON(ctx, rc, "/apis/"+k.APIVersion, "APIResourceList", &resources); err != nil {
		return false, err
	}
	return slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == k.Resource }), nil
}

// getJSON reads the discovery document at path, which must be of kind.
func getJSON(ctx context.Context, rc rest.Interface, path, kind string, into any) error {
	body, err := rc.Get().AbsPath(path).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var tm metav1.TypeMeta
	if json.Unmarshal(body, &tm) != nil || tm.Kind != kind {
		return fmt.Errorf("%s: the response is not an %s", path, kind)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// kept counts the decoded objects of one kind.
func kept(r *decode.Result, kind string) int {
	c := &r.Cluster
	switch kind {
	case "Namespace":
		return len(c.Namespaces)
	case "Node":
		return len(c.Nodes)
	case "Pod":
		return len(c.Pods)
	case "NetworkPolicy":
		return len(c.NetworkPolicies)
	case "ClusterNetworkPolicy":
		return len(c.ClusterNetworkPolicies)
	}
	return 0
}

// DefaultMaxPages bounds how many pages one list may take (5 million
// objects at the default page size): a server, or something in front of
// it, that keeps answering with a continue token must not keep Moat
// listing.
const DefaultMaxPages = 10000

// listPages streams one kind page by page into r. Every page must be a
// List of the kind (a PodList...; see decode.Result.DecodeListPage), and
// the continue tokens must move on: a token given twice, more than
// maxPages pages, or a token on an unpaginated list is an error. Items of
// a typed list carry no kind of their own; the decoder takes it from the
// list. Diagnostics name the source "cluster/<resource>".
func listPages(ctx context.Context, rc rest.Interface, r *decode.Result, k Kind, size int64, maxPages int) error {
	token := ""
	seen := map[string]bool{}
	for page := 1; ; page++ {
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
		// Stream, like Do, turns a non-2xx answer into the server's
		// Status (reason, message), which IsNotFound and IsGone read.
		body, err := req.Stream(ctx)
		if err != nil {
			return err
		}
		token, err = r.DecodeListPage("cluster/"+k.Resource, body, k.APIVersion, k.Kind)
		body.Close()
		if err != nil {
			return fmt.Errorf("decode list response: %w", err)
		}
		switch {
		case token == "":
			return nil
		case size == 0:
			return fmt.Errorf("page %d: a continue token on a list asked for without a limit: the list may be incomplete", page)
		case seen[token]:
			return fmt.Errorf("page %d: the continue token of an earlier page again: the list does not progress", page)
		case page == maxPages:
			return fmt.Errorf("more than %d pages of %d", maxPages, size)
		}
		seen[token] = true
	}
}
