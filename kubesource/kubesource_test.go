package kubesource

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// fakeServer serves lists of n pods page by page, answers 404 for
// ClusterNetworkPolicies and, if expire is set, 410 for the first
// continued request (as a server does when the continue token is too old).
type fakeServer struct {
	pods     int
	expire   bool
	expired  bool
	requests []string
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests = append(f.requests, r.URL.RequestURI())
	w.Header().Set("Content-Type", "application/json") // as the API server says, also for a Status
	q := r.URL.Query()
	switch r.URL.Path {
	case "/api/v1/pods":
		if q.Get("fieldSelector") != "status.phase!=Succeeded,status.phase!=Failed" {
			http.Error(w, "no field selector", http.StatusBadRequest)
			return
		}
		start, _ := strconv.Atoi(q.Get("continue"))
		if start > 0 && f.expire && !f.expired {
			f.expired = true
			w.WriteHeader(http.StatusGone)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"continue token expired"}`)
			return
		}
		end := f.pods
		if l, _ := strconv.Atoi(q.Get("limit")); l > 0 && start+l < f.pods {
			end = start + l
		}
		var items []string
		for i := start; i < end; i++ {
			items = append(items, fmt.Sprintf(`{"metadata":{"name":"p%d","namespace":"ns"},"status":{"podIP":"10.0.0.%d"}}`, i, i+1))
		}
		cont := ""
		if end < f.pods {
			cont = strconv.Itoa(end)
		}
		fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"continue":%q},"items":[%s]}`, cont, strings.Join(items, ","))
	case "/api/v1/namespaces", "/api/v1/nodes", "/apis/networking.k8s.io/v1/networkpolicies":
		emptyList(w, r.URL.Path)
	case "/apis":
		fmt.Fprint(w, groupsWithoutCNPs)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}
}

// Discovery's group list (/apis) without, and with, the group version of
// ClusterNetworkPolicies.
const (
	groupsWithoutCNPs = `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"networking.k8s.io","versions":[{"groupVersion":"networking.k8s.io/v1","version":"v1"}]}]}`
	groupsWithCNPs    = `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"networking.k8s.io","versions":[{"groupVersion":"networking.k8s.io/v1","version":"v1"}]},{"name":"policy.networking.k8s.io","versions":[{"groupVersion":"policy.networking.k8s.io/v1alpha2","version":"v1alpha2"}]}]}`
)

// emptyList answers the list of the kind path lists with no items, as
// the API server does.
func emptyList(w http.ResponseWriter, path string) {
	w.Header().Set("Content-Type", "application/json")
	for _, k := range Kinds {
		if k.Path == path {
			fmt.Fprintf(w, `{"kind":"%sList","apiVersion":%q,"metadata":{},"items":[]}`, k.Kind, k.APIVersion)
			return
		}
	}
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
}

func TestListPagesAndExpiry(t *testing.T) {
	for _, tc := range []struct {
		name        string
		expire      bool
		wantPodReqs int
	}{
		{"pages", false, 4},           // 7 pods, 2 per page
		{"expired continue", true, 3}, // first page, the 410, then one full list
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeServer{pods: 7, expire: tc.expire}
			srv := httptest.NewServer(fake)
			defer srv.Close()
			snap, err := List(context.Background(), &rest.Config{Host: srv.URL}, Options{PageSize: 2})
			if err != nil {
				t.Fatal(err)
			}
			res := snap.Result
			if snap.Count["Pod"] != 7 || len(res.Cluster.Pods) != 7 || len(res.Dropped) != 0 {
				t.Errorf("count %d, decoded %d pods, dropped %v", snap.Count["Pod"], len(res.Cluster.Pods), res.Dropped)
			}
			podReqs := 0
			for _, r := range fake.requests {
				if strings.HasPrefix(r, "/api/v1/pods") {
					podReqs++
				}
			}
			if podReqs != tc.wantPodReqs {
				t.Errorf("%d pod list requests, want %d: %v", podReqs, tc.wantPodReqs, fake.requests)
			}
			if len(snap.NotServed) != 1 || snap.NotServed[0] != "ClusterNetworkPolicy" {
				t.Errorf("not served: %v", snap.NotServed)
			}
			seen := map[string]bool{}
			for _, p := range res.Cluster.Pods {
				seen[p.Name] = true
			}
			if len(seen) != 7 {
				t.Errorf("distinct pods %d: a page was read twice or lost", len(seen))
			}
		})
	}
}

// Anything but an optional kind not being served fails the listing: a
// snapshot without some policies could widen access.
func TestListFailsClosed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/apis/networking.k8s.io/v1/networkpolicies" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"networkpolicies is forbidden"}`)
			return
		}
		emptyList(w, r.URL.Path)
	}))
	defer srv.Close()
	_, err := List(context.Background(), &rest.Config{Host: srv.URL}, Options{})
	if err == nil || !strings.Contains(err.Error(), "list NetworkPolicy") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("err = %v", err)
	}
}

// A list answer that is not what the API server answers is an error
// naming the resource, never fewer objects: a page that is not a List of
// the kind (an empty body, a Status, a generic List; what a proxy or a
// gateway in front of the server may send with 200), continue tokens that
// do not move on, and a 404 for ClusterNetworkPolicies that discovery
// contradicts or cannot confirm. They are not served only when discovery
// does not list them.
func TestListRefusesWhatIsNotAList(t *testing.T) {
	const (
		npPath    = "/apis/networking.k8s.io/v1/networkpolicies"
		cnpPath   = "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"
		groupPath = "/apis"
		gvPath    = "/apis/policy.networking.k8s.io/v1alpha2"
		status    = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}`
		noCNPs    = `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"policy.networking.k8s.io/v1alpha2","resources":[{"name":"adminnetworkpolicies","namespaced":false,"kind":"AdminNetworkPolicy","verbs":["list"]}]}`
		cnps      = `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"policy.networking.k8s.io/v1alpha2","resources":[{"name":"clusternetworkpolicies","namespaced":false,"kind":"ClusterNetworkPolicy","verbs":["list"]}]}`
	)
	type answer struct {
		code        int
		contentType string
		body        string
	}
	json := func(code int, body string) answer { return answer{code, "application/json", body} }
	html404 := answer{404, "text/html", "<html><body>404 Not Found</body></html>"}
	empty404 := answer{404, "", ""} // kube-apiserver's answer for a group it does not serve
	for _, tc := range []struct {
		name string
		// answers replace the fake API server's for some paths. Pods
		// are paginated when continues is set: "same" gives the same
		// continue token every page, "new" a new one.
		answers   map[string]answer
		continues string
		err       string // what the error says; "" for success
		notServed bool
	}{
		{"a proper server", nil, "", "", false},
		{"CNPs not served: 404, and no group in discovery", map[string]answer{cnpPath: empty404, groupPath: json(200, groupsWithoutCNPs)}, "", "", true},
		{"CNPs not served: an HTML 404, and no group in discovery", map[string]answer{cnpPath: html404, groupPath: json(200, groupsWithoutCNPs)}, "", "", true},
		{"CNPs not served: 404 Status, the group version without them", map[string]answer{cnpPath: json(404, status), gvPath: json(200, noCNPs)}, "", "", true},
		{"empty body", map[string]answer{npPath: json(200, "")}, "", "list NetworkPolicy from URL: decode list response: cluster/networkpolicies: empty response, want a networking.k8s.io/v1 NetworkPolicyList", false},
		{"a Status with 200", map[string]answer{npPath: json(200, status)}, "", "cluster/networkpolicies: the response is a v1 Status, want a networking.k8s.io/v1 NetworkPolicyList", false},
		{"a generic List", map[string]answer{npPath: json(200, `{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}`)}, "", "the response is a v1 List, want a networking.k8s.io/v1 NetworkPolicyList", false},
		{"HTML with 200", map[string]answer{npPath: {200, "text/html", "<html><body>sign in</body></html>"}}, "", "cluster/networkpolicies#1: invalid JSON", false},
		{"the same continue token again", nil, "same", "list Pod from URL: page 2: the continue token of an earlier page again", false},
		{"continue tokens without end", nil, "new", "list Pod from URL: more than 5 pages of 500", false},
		{"CNPs: an HTML 404, discovery lists them", map[string]answer{cnpPath: html404}, "", "list ClusterNetworkPolicy from URL: the server could not find the requested resource, but discovery lists clusternetworkpolicies in policy.networking.k8s.io/v1alpha2", false},
		{"CNPs: an HTML 404, and HTML for discovery", map[string]answer{cnpPath: html404, groupPath: html404}, "", "discovery: /apis: the server could not find the requested resource", false},
		{"CNPs: a 404 Status, discovery not a group list", map[string]answer{cnpPath: json(404, status), groupPath: json(200, `{}`)}, "", "discovery: /apis: the response is not an APIGroupList", false},
		{"CNPs: a 404 Status, the group version not a resource list", map[string]answer{cnpPath: json(404, status), gvPath: json(200, groupsWithCNPs)}, "", "discovery: /apis/policy.networking.k8s.io/v1alpha2: the response is not an APIResourceList", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if a, ok := tc.answers[r.URL.Path]; ok {
					if a.contentType != "" {
						w.Header().Set("Content-Type", a.contentType)
					}
					w.WriteHeader(a.code)
					fmt.Fprint(w, a.body)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				switch {
				case r.URL.Path == "/api/v1/pods" && tc.continues != "":
					page++
					token := "same"
					if tc.continues == "new" {
						token = strconv.Itoa(page)
					}
					fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"continue":%q},"items":[]}`, token)
				case r.URL.Path == groupPath:
					fmt.Fprint(w, groupsWithCNPs)
				case r.URL.Path == gvPath:
					fmt.Fprint(w, cnps)
				default:
					emptyList(w, r.URL.Path)
				}
			}))
			defer srv.Close()
			snap, err := List(context.Background(), &rest.Config{Host: srv.URL}, Options{MaxPages: 5})
			want := strings.ReplaceAll(tc.err, "URL", srv.URL)
			if tc.err == "" && (err != nil || (len(snap.NotServed) > 0) != tc.notServed) {
				t.Fatalf("err %v, snapshot %+v", err, snap)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), want)) {
				t.Fatalf("err %v, want one containing %q", err, want)
			}
		})
	}
}
