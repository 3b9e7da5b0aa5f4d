package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	corev1 "k8s.io/api/core/v1"
)

func TestTransient(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{"EOF", fmt.Errorf("get pods: %w", io.ErrUnexpectedEOF), true},
		{"429", apierrors.NewTooManyRequests("slow down", 1), true},
		{"503", apierrors.NewServiceUnavailable("starting"), true},
		{"500", apierrors.NewInternalError(errors.New("boom")), true},
		{"504", apierrors.NewTimeoutError("slow", 1), true},
		{"410 Gone: the reflector relists", apierrors.NewResourceExpired("too old"), false},
		{"resource version too large: the reflector relists", &apierrors.StatusError{ErrStatus: metav1.Status{Code: 504, Reason: metav1.StatusReasonTimeout, Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge}}}}}, false},
		{"400", apierrors.NewBadRequest("no"), false},
		{"422", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "x", nil), false},
		{"403 while the server starts", apierrors.NewForbidden(pods, "", errors.New("rbac")), true},
		{"401 while a token rotates", apierrors.NewUnauthorized("expired"), true},
		{"404: CRD not installed yet", apierrors.NewNotFound(pods, ""), true},
		{"canceled", context.Canceled, false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("%s: transient = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	for attempt := range 20 {
		d := retryDelay(attempt, errors.New("refused"))
		lo := min(retryInitial<<min(attempt, 10), retryCap)
		if d < lo || d > lo+lo/2 {
			t.Errorf("attempt %d: delay %s outside [%s, %s]", attempt, d, lo, lo+lo/2)
		}
	}
	if d := retryDelay(0, apierrors.NewTooManyRequests("slow down", 5)); d < 5*time.Second {
		t.Errorf("Retry-After 5 s ignored: %s", d)
	}
}

// fakeWatcher is a list/watch whose calls fail with the queued errors
// first.
type fakeWatcher struct {
	errs    []error
	calls   atomic.Int32
	watcher *watch.FakeWatcher
}

func (f *fakeWatcher) next() error {
	i := int(f.calls.Add(1)) - 1
	if i < len(f.errs) {
		return f.errs[i]
	}
	return nil
}

func testAgentForWatch() *Agent {
	return &Agent{log: klog.Background(), metrics: newMetrics()}
}

// TestListWatchRetriesTransientFailures: the reflector never sees a
// refused connection (so never backs off), but does see the answers it
// must act on; every failure is counted and the state follows.
func TestListWatchRetriesTransientFailures(t *testing.T) {
	a := testAgentForWatch()
	s := a.watchState("pods")
	refused := &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
	f := &fakeWatcher{errs: []error{refused, refused, apierrors.NewServiceUnavailable("starting")}, watcher: watch.NewFake()}
	lw := a.listWatch(s, &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			if err := f.next(); err != nil {
				return nil, err
			}
			return &corev1.PodList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			if err := f.next(); err != nil {
				return nil, err
			}
			return f.watcher, nil
		},
	})
	if st := s.status(time.Now()); st.Watching || st.Stale <= 0 || !st.LastContact.IsZero() {
		t.Errorf("before any call: %+v", st)
	}
	start := time.Now()
	if _, err := lw.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("list returned %v; transient failures must be retried inside", err)
	}
	if took := time.Since(start); took < 3*retryInitial {
		t.Errorf("three retries took %s: no backoff", took)
	}
	if f.calls.Load() != 4 {
		t.Errorf("%d list calls, want 4", f.calls.Load())
	}
	if v := testutilValue(t, a, "moat_agent_watch_errors_total", `resource="pods"`); v != "3" {
		t.Errorf("watch errors = %s, want 3", v)
	}
	if st := s.status(time.Now()); st.LastError != nil || st.LastContact.IsZero() {
		t.Errorf("after a successful list: %+v", st)
	}

	w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.status(time.Now()); !st.Watching || st.Stale != 0 {
		t.Errorf("watch open: %+v", st)
	}
	before := s.contact.Load()
	time.Sleep(time.Millisecond)
	go f.watcher.Add(&corev1.Pod{})
	if ev := <-w.ResultChan(); ev.Type != watch.Added {
		t.Fatalf("event %v", ev.Type)
	}
	if s.contact.Load() <= before {
		t.Error("a watch event did not count as contact")
	}
	if v := testutilValue(t, a, "moat_agent_watch_events_total", `resource="pods"`); v != "1" {
		t.Errorf("watch events = %s, want 1", v)
	}
	f.watcher.Stop()
	if _, ok := <-w.ResultChan(); ok {
		t.Fatal("watch channel still open after the server closed it")
	}
	time.Sleep(10 * time.Millisecond)
	if st := s.status(time.Now()); st.Watching || st.Stale <= 0 {
		t.Errorf("watch closed: %+v", st)
	}
	if line := s.status(time.Now()).String(); !regexpMatch(`^watch pods: stale for [0-9.]+m?s \(not watching; last event [0-9.]+m?s ago\)$`, line) {
		t.Errorf("status line %q", line)
	}

	// An answer that means something goes to the reflector at once.
	f.errs = append(f.errs, apierrors.NewResourceExpired("too old"))
	f.calls.Store(int32(len(f.errs) - 1))
	if _, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{}); !apierrors.IsResourceExpired(err) {
		t.Errorf("watch = %v, want the 410 passed on", err)
	}
	if st := s.status(time.Now()); st.LastError == nil {
		t.Error("failing call not reported")
	}

	// Retrying stops with the agent.
	f.errs = []error{refused, refused, refused, refused, refused, refused, refused, refused}
	f.calls.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); err == nil {
		t.Error("list succeeded although every call failed")
	}
}

// TestObservedWatchStop: stopping the wrapper stops the server's watch
// and closes the channel, and the watch no longer counts as open.
func TestObservedWatchStop(t *testing.T) {
	s := newWatchState("nodes")
	fw := watch.NewFake()
	w := observe(s, fw)
	if s.open.Load() != 1 {
		t.Fatal("not open")
	}
	w.Stop()
	w.Stop()
	if _, ok := <-w.ResultChan(); ok {
		t.Fatal("channel open after Stop")
	}
	if !fw.IsStopped() {
		t.Error("underlying watch not stopped")
	}
	deadline := time.Now().Add(time.Second)
	for s.open.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s.open.Load() != 0 {
		t.Error("still counted open")
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }
