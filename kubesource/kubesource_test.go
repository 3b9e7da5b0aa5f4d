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
		fmt.Fprint(w, `{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}
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
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"networkpolicies is forbidden"}`)
			return
		}
		fmt.Fprint(w, `{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}`)
	}))
	defer srv.Close()
	_, err := List(context.Background(), &rest.Config{Host: srv.URL}, Options{})
	if err == nil || !strings.Contains(err.Error(), "list NetworkPolicy") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("err = %v", err)
	}
}
