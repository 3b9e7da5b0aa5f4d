package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"
)

// Retrying transient list and watch failures. client-go's reflector backs
// off from 800 ms, doubling, to a 30 s cap with full jitter, and a shared
// informer cannot be given another backoff: after a 30 s API server
// outage the agent then learnt of a change 40-56 s after the server was
// back, a window in which a revoked access stayed open. The agent retries
// transient failures (no connection, 401, 403, 404, 429, 5xx) itself inside the list or
// watch call, from retryInitial to retryCap, so the reflector never sees
// them and never backs off; it still sees, and handles as before, the
// answers that need another request (410 Gone: relist).
const (
	retryInitial = 250 * time.Millisecond
	retryCap     = 3 * time.Second
	// retryJitter spreads the retries of many agents by up to half a
	// period, so that they do not reach a recovering server in step.
	retryJitter = 0.5
)

// retryDelay is the wait before retry number attempt (0-based).
func retryDelay(attempt int, err error) time.Duration {
	d := retryInitial << min(attempt, 10)
	d = min(d, retryCap)
	d += time.Duration(rand.Float64() * retryJitter * float64(d))
	// A server that sheds load says when to come back.
	if s, ok := apierrors.SuggestsClientDelay(err); ok && time.Duration(s)*time.Second > d {
		d = time.Duration(s) * time.Second
	}
	return d
}

// transient reports whether a list or watch error may go away by itself
// with the same request: no answer at all (connection refused or reset,
// EOF, timeouts), an overloaded or starting server (429, 5xx; while it
// starts, kube-apiserver also answers 403 until its RBAC caches are
// filled), a credential being rotated (401) or a resource not served yet
// (404: the CRD is not installed). Answers that need another request go
// to the reflector, which knows what to do: 410 Gone and a resource
// version too large (relist from scratch), and any other 4xx.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// Not an answer from the API server: no connection, a connection
		// lost, a timeout.
		return true
	}
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		return false
	}
	switch code := status.Status().Code; {
	case code == 401, code == 403, code == 404, code == 429, code >= 500:
		return true
	}
	return false
}

// watchState is what the agent knows about one resource's list and watch:
// the basis of the staleness metric and of /readyz's detail.
type watchState struct {
	resource string
	start    time.Time
	// open counts the watches open now (0 or 1 for a reflector).
	open atomic.Int32
	// contact is the Unix nano time of the last successful list, watch
	// start or watch event (bookmarks included).
	contact atomic.Int64

	// events counts the watch events received (nil: not counted).
	events prometheus.Counter

	mu      sync.Mutex
	lastErr error
	// failing: time the current run of failed calls began (zero if none).
	failing time.Time
}

func newWatchState(resource string) *watchState {
	return &watchState{resource: resource, start: time.Now()}
}

func (s *watchState) touch() { s.contact.Store(time.Now().UnixNano()) }

func (s *watchState) succeeded() {
	s.touch()
	s.mu.Lock()
	s.failing = time.Time{}
	s.mu.Unlock()
}

func (s *watchState) failed(err error) {
	s.mu.Lock()
	s.lastErr = err
	if s.failing.IsZero() {
		s.failing = time.Now()
	}
	s.mu.Unlock()
}

// WatchStatus says how current the agent's cache of one resource is.
type WatchStatus struct {
	// Resource is the informer's resource (pods, namespaces, nodes,
	// networkpolicies, clusternetworkpolicies).
	Resource string
	// Watching: a watch is open, so the cache follows the server.
	Watching bool
	// LastContact is the time of the last successful list, watch start or
	// watch event; zero before the first.
	LastContact time.Time
	// Stale is zero while a watch is open, else how long the cache may
	// have been missing changes: the time since LastContact (since the
	// agent started if there was none).
	Stale time.Duration
	// LastError is the last failed list or watch call, if calls fail now.
	LastError error
}

func (s *watchState) status(now time.Time) WatchStatus {
	st := WatchStatus{Resource: s.resource, Watching: s.open.Load() > 0}
	from := s.start
	if c := s.contact.Load(); c != 0 {
		st.LastContact = time.Unix(0, c)
		from = st.LastContact
	}
	if !st.Watching {
		st.Stale = max(now.Sub(from), 0)
	}
	s.mu.Lock()
	if !s.failing.IsZero() {
		st.LastError = s.lastErr
	}
	s.mu.Unlock()
	return st
}

// String is one line of /readyz's detail.
func (w WatchStatus) String() string {
	since := "never"
	if !w.LastContact.IsZero() {
		since = time.Since(w.LastContact).Round(100*time.Millisecond).String() + " ago"
	}
	var s string
	if w.Watching {
		s = fmt.Sprintf("watch %s: current (watching; last event %s)", w.Resource, since)
	} else {
		s = fmt.Sprintf("watch %s: stale for %s (not watching; last event %s)", w.Resource, w.Stale.Round(100*time.Millisecond), since)
	}
	if w.LastError != nil {
		s += "; failing: " + w.LastError.Error()
	}
	return s
}

// Watches returns how current each of the agent's caches is, for /readyz.
// Rules stay in force whatever this says; a stale cache means changes
// made since may not be enforced yet.
func (a *Agent) Watches() []WatchStatus {
	now := time.Now()
	out := make([]WatchStatus, len(a.watches))
	for i, s := range a.watches {
		out[i] = s.status(now)
	}
	return out
}

// listWatch wraps a resource's list and watch: transient failures are
// retried here (see retryInitial), every failure is counted, and every
// success and event is recorded in the resource's watchState.
func (a *Agent) listWatch(s *watchState, lw *cache.ListWatch) *cache.ListWatch {
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	// retry calls f until it succeeds, fails for good, or ctx ends.
	retry := func(ctx context.Context, verb string, f func() error) error {
		for attempt := 0; ; attempt++ {
			err := f()
			if err == nil {
				if attempt > 0 {
					a.log.Info("API server reachable again", "resource", s.resource, "verb", verb, "attempts", attempt+1)
				}
				return nil
			}
			if ctx.Err() != nil {
				return err
			}
			a.metrics.watchErrors.WithLabelValues(s.resource).Inc()
			s.failed(err)
			if !transient(err) {
				return err // the reflector handles it
			}
			d := retryDelay(attempt, err)
			if attempt%20 == 0 {
				// The first failure of a run, then about once a minute.
				a.log.Info("List or watch failed; retrying", "resource", s.resource, "verb", verb, "err", err.Error(), "attempts", attempt+1)
			} else {
				a.log.V(4).Info("Retrying", "resource", s.resource, "verb", verb, "err", err.Error(), "in", d)
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			var obj runtime.Object
			err := retry(ctx, "list", func() (err error) {
				obj, err = list(ctx, o)
				return err
			})
			if err != nil {
				return nil, err
			}
			s.succeeded()
			return obj, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			var w watch.Interface
			err := retry(ctx, "watch", func() (err error) {
				w, err = watchFn(ctx, o)
				return err
			})
			if err != nil {
				return nil, err
			}
			s.succeeded()
			return observe(s, w), nil
		},
	}
}

// observedWatch passes a watch's events on and records each in the
// resource's watchState; the watch counts as open until its channel
// closes or it is stopped.
type observedWatch struct {
	w    watch.Interface
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func observe(s *watchState, w watch.Interface) watch.Interface {
	o := &observedWatch{w: w, out: make(chan watch.Event), done: make(chan struct{})}
	s.open.Add(1)
	go func() {
		defer close(o.out)
		defer s.open.Add(-1)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				if ev.Type == watch.Error {
					s.failed(apierrors.FromObject(ev.Object))
				} else {
					s.touch()
				}
				if s.events != nil {
					s.events.Inc()
				}
				select {
				case o.out <- ev:
				case <-o.done:
					return
				}
			case <-o.done:
				return
			}
		}
	}()
	return o
}

func (o *observedWatch) ResultChan() <-chan watch.Event { return o.out }

func (o *observedWatch) Stop() {
	o.once.Do(func() {
		close(o.done)
		o.w.Stop()
	})
}
