package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/policy"
)

// ConditionAccepted is the ClusterNetworkPolicy condition the leader
// maintains: True when the policy is enforced as written, False with
// reason InvalidSpec or UnknownField when (parts of) it are enforced
// fail-closed.
const ConditionAccepted = "Accepted"

// Condition reasons. InvalidSpec and UnknownField come from the compiler
// (policy.PolicyStatus.Reason).
const (
	ReasonAccepted     = "Accepted"
	ReasonInvalidSpec  = "InvalidSpec"
	ReasonUnknownField = "UnknownField"
)

// Event reasons.
const (
	// EventPolicyProblem: a NetworkPolicy or ClusterNetworkPolicy that is
	// enforced fail-closed, or a NetworkPolicy named port that resolves on
	// no pod.
	EventPolicyProblem = "PolicyProblem"
	// EventNodeSyncFailed: a node could not program its rules (the previous
	// ones stay in force); on the Node only.
	EventNodeSyncFailed = "NodeSyncFailed"
)

// eventSource is the component of the agents' Events.
const eventSource = "moat-agent"

// fieldManager names the agent in managedFields of its status writes.
const fieldManager = "moat-agent"

// maxMessage bounds condition and event messages (the API allows 32768
// for conditions; events are shorter in practice).
const maxMessage = 1024

// published is what one sync hands to the status writer. Handing it over
// costs nothing per sync: the writer (the leader only) indexes the
// statuses when it writes.
type published struct {
	policies compiled
	pods     []policy.Pod
	diags    []policy.Diagnostic
	// nps are the NetworkPolicies diags name, by namespace/name, as
	// compiled: the writer reports on exactly these generations.
	nps map[string]*policy.NetworkPolicy

	status     []policy.PolicyStatus
	statusOnce sync.Once
	byRef      map[policy.PolicyRef]policy.PolicyStatus
}

// kindCNPStatus is the PolicyRef kind of a ClusterNetworkPolicy.
const kindCNPStatus = "ClusterNetworkPolicy"

// statusOf finds the compiled status of a ClusterNetworkPolicy, the only
// kind with a status to write. The index holds only those: with every
// NetworkPolicy's too, the leader built a map of 3.4 MB for each status
// write at 22,500 policies (the 30,000-pod benchmark's).
func (p *published) statusOf(ref policy.PolicyRef) (policy.PolicyStatus, bool) {
	p.statusOnce.Do(func() {
		p.byRef = map[policy.PolicyRef]policy.PolicyStatus{}
		for _, st := range p.status {
			if st.Policy.Kind == kindCNPStatus {
				p.byRef[st.Policy] = st
			}
		}
	})
	st, ok := p.byRef[ref]
	return st, ok
}

// statusWriter reports what the compiler concluded: the leader writes
// ClusterNetworkPolicy conditions and policy Events; every agent reports
// its own node's failures.
type statusWriter struct {
	a        *Agent
	latest   atomic.Pointer[published]
	notify   chan struct{}
	leading  atomic.Bool
	recorder record.EventRecorder
	bc       record.EventBroadcaster

	// emitted remembers the problems already reported as Events, by
	// object and generation, so each is reported once (leader only).
	mu      sync.Mutex
	emitted map[string]string
	// passes counts the leader's status passes (write), for tests.
	passes atomic.Int64
}

func newStatusWriter(a *Agent) *statusWriter {
	return &statusWriter{a: a, notify: make(chan struct{}, 1), emitted: map[string]string{}}
}

// startEvents starts the Event pipeline; stopEvents flushes and ends it.
func (w *statusWriter) startEvents(ctx context.Context) {
	w.bc = record.NewBroadcaster(record.WithContext(ctx))
	w.bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.a.clients.Kube.CoreV1().Events("")})
	w.recorder = w.bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventSource, Host: w.a.cfg.NodeName})
}

func (w *statusWriter) stopEvents() {
	if w.bc != nil {
		w.bc.Shutdown()
	}
}

// publish hands the result of a compilation to the writer.
// nps finds NetworkPolicies as compiled (policy.Compiler.NetworkPolicies);
// it is called here, on the compiling goroutine, never by the writer.
func (w *statusWriter) publish(c compiled, prog *policy.Program, nps func(keys []string) map[string]*policy.NetworkPolicy) {
	p := &published{policies: c, pods: prog.Pods, status: prog.Status, diags: prog.Diagnostics}
	if last := w.latest.Load(); last != nil && sameSlice(last.diags, p.diags) {
		// The diagnostics are those of the last Program, which changes
		// them whenever a NetworkPolicy changes: so are the policies.
		p.nps = last.nps
	} else {
		p.nps = diagnosedNPs(p.diags, nps)
	}
	w.latest.Store(p)
	w.nudge()
}

// diagnosedNPs finds the NetworkPolicies that diagnostics name, in one
// lookup: one namespace can hold thousands of them.
func diagnosedNPs(diags []policy.Diagnostic, nps func(keys []string) map[string]*policy.NetworkPolicy) map[string]*policy.NetworkPolicy {
	var keys []string
	for _, d := range diags {
		if key, ok := strings.CutPrefix(d.Object, "NetworkPolicy "); ok {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	return nps(keys)
}

// sameSlice reports whether a and b are one slice (Programs share their
// predecessor's diagnostics when none changed).
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func (w *statusWriter) nudge() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// lead writes status after every compilation until leadership ends.
func (w *statusWriter) lead(ctx context.Context) {
	reported := w.reportedProblems(ctx)
	w.mu.Lock()
	w.emitted = reported
	w.mu.Unlock()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.notify:
		case <-retry.C:
		}
		if again := w.write(ctx); again {
			retry.Reset(time.Second)
		}
	}
}

// write brings every ClusterNetworkPolicy's Accepted condition in line
// with the latest compilation and reports policy problems as Events. It
// returns true when something should be tried again.
func (w *statusWriter) write(ctx context.Context) (again bool) {
	p := w.latest.Load()
	if p == nil {
		return false
	}
	names := make([]string, 0, len(p.policies.cnps))
	for n := range p.policies.cnps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if ctx.Err() != nil {
			return false
		}
		compiled := p.policies.cnps[name]
		st, ok := p.statusOf(policy.PolicyRef{Kind: kindCNPStatus, Name: name})
		if !ok {
			continue
		}
		if w.writeCNP(ctx, compiled, st) {
			again = true
		}
	}
	w.reportNPs(p)
	w.passes.Add(1)
	return again
}

// desiredCondition is the Accepted condition for a compiled policy. The
// compiler's status already says what is wrong (wrongly typed parts
// included, and each field a disabled feature gate hides, naming the
// gate); for those it adds the agent's flag that enables them.
func desiredCondition(cnp *decodedCNP, st policy.PolicyStatus, opts policy.Options) metav1.Condition {
	c := metav1.Condition{Type: ConditionAccepted, ObservedGeneration: cnp.Generation}
	switch {
	case st.Accepted:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonAccepted, "enforced as written"
	default:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, st.Reason, st.Message
		if c.Reason == "" {
			c.Reason = ReasonInvalidSpec
		}
		if len(policy.GatedFields(&cnp.ClusterNetworkPolicy, opts)) > 0 {
			c.Message += fmt.Sprintf(" (moat-agent --feature-gates=%s=true enables the gated fields)", features.IngressNetworksAndNodes)
		}
	}
	c.Message = truncate(c.Message)
	return c
}

// truncate cuts s to maxMessage bytes, dropping a character the cut
// would split (a message may quote any text of the policy).
func truncate(s string) string {
	if len(s) > maxMessage {
		return strings.ToValidUTF8(s[:maxMessage-3], "") + "..."
	}
	return s
}

// writeCNP patches one policy's status if its condition differs from
// what the API server holds. It returns true when the write should be
// retried.
func (w *statusWriter) writeCNP(ctx context.Context, compiled *decodedCNP, st policy.PolicyStatus) bool {
	obj, exists, err := w.a.inf.cnps.GetStore().GetByKey(compiled.Name)
	if err != nil || !exists {
		return false
	}
	cur, ok := obj.(*decodedCNP)
	if !ok || cur.Generation != compiled.Generation || cur.UID != compiled.UID {
		// Changed since it was compiled: the next sync reports on it.
		return false
	}
	want := desiredCondition(compiled, st, w.a.policyOptions())
	conds := append([]metav1.Condition(nil), cur.Status.Conditions...)
	if old := meta.FindStatusCondition(conds, ConditionAccepted); old != nil &&
		old.Status == want.Status && old.Reason == want.Reason && old.Message == want.Message && old.ObservedGeneration == want.ObservedGeneration {
		return false
	}
	meta.SetStatusCondition(&conds, want)
	body, err := json.Marshal(map[string]any{
		// The resourceVersion makes the patch fail on a concurrent change
		// instead of overwriting another writer's conditions.
		"metadata": map[string]any{"resourceVersion": cur.ResourceVersion},
		"status":   v1alpha2.ClusterNetworkPolicyStatus{Conditions: conds},
	})
	if err != nil {
		w.a.log.Error(err, "Encode status", "clusterNetworkPolicy", compiled.Name)
		return false
	}
	_, err = w.a.clients.Dynamic.Resource(clusterNetworkPolicyGVR).Patch(ctx, compiled.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	switch {
	case err == nil:
		w.a.metrics.statusWrites.WithLabelValues("success").Inc()
		w.a.log.V(2).Info("Wrote status", "clusterNetworkPolicy", compiled.Name, "accepted", want.Status, "reason", want.Reason)
		if want.Status == metav1.ConditionFalse {
			w.event(cnpRef(compiled), corev1.EventTypeWarning, EventPolicyProblem, want.Message)
		}
		return false
	case apierrors.IsConflict(err):
		w.a.metrics.statusWrites.WithLabelValues("conflict").Inc()
		return true
	case apierrors.IsNotFound(err):
		return false
	default:
		w.a.metrics.statusWrites.WithLabelValues("error").Inc()
		w.a.log.Error(err, "Write status", "clusterNetworkPolicy", compiled.Name)
		return true
	}
}

func cnpRef(c *decodedCNP) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		Kind: "ClusterNetworkPolicy", APIVersion: v1alpha2.SchemeGroupVersion.String(),
		Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion,
	}
}

func npRef(n *policy.NetworkPolicy) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1",
		Namespace: n.Namespace, Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
	}
}

func (w *statusWriter) event(ref *corev1.ObjectReference, typ, reason, msg string) {
	if w.recorder != nil {
		w.recorder.Event(ref, typ, reason, truncate(msg))
	}
}

// annotationGeneration on a NetworkPolicy's PolicyProblem Event is the
// generation of the policy it reports on: with the object and the message
// it identifies the problem (problemID), so that a new leader can tell
// which problems its predecessors already reported (reportedProblems).
const annotationGeneration = "moat-net.github.io/generation"

// reportedProblemsTimeout bounds the list of Events a new leader makes
// before it writes (reportedProblems).
const reportedProblemsTimeout = 30 * time.Second

// problemID identifies one reported problem of a NetworkPolicy: its
// namespace/name, generation and the Event's message.
func problemID(key string, generation int64, msg string) string {
	return fmt.Sprintf("%s@%d|%s", key, generation, truncate(msg))
}

// reportedProblems lists the NetworkPolicy problems that Events in the
// cluster already report (Events this or an earlier leader sent, until
// the API server's --event-ttl removes them, 1 hour by default). Without
// it a new leader, whose memory starts empty, sent every problem of the
// cluster again at each change of leader, that is at every restart of
// the leader's pod, rollouts included. On an error (for example RBAC
// without list on events) it returns what it has, and the problems not
// found are reported again.
func (w *statusWriter) reportedProblems(ctx context.Context) map[string]string {
	got := map[string]string{}
	sel := fields.Set{
		"source":              eventSource,
		"reason":              EventPolicyProblem,
		"involvedObject.kind": "NetworkPolicy",
	}.AsSelector().String()
	opts := metav1.ListOptions{FieldSelector: sel, Limit: 500}
	// Bounded: the leader writes nothing until this returns.
	ctx, cancel := context.WithTimeout(ctx, reportedProblemsTimeout)
	defer cancel()
	for {
		list, err := w.a.clients.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			w.a.log.Error(err, "List the PolicyProblem Events already sent; problems they report may be reported again")
			return got
		}
		for _, e := range list.Items {
			gen, err := strconv.ParseInt(e.Annotations[annotationGeneration], 10, 64)
			if err != nil {
				continue // not one of ours, or from a version without the annotation
			}
			got[problemID(e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name, gen, e.Message)] = ""
		}
		if list.Continue == "" {
			return got
		}
		opts.Continue = list.Continue
	}
}

// reportNPs emits one Warning Event per new problem of a NetworkPolicy:
// the compiler's diagnostics about it (invalid or unknown fields, enforced
// fail-closed; named ports that resolve on no pod), which cover every
// NetworkPolicy of the cluster whatever the node's scope.
func (w *statusWriter) reportNPs(p *published) {
	byObject := map[string][]string{}
	for _, d := range p.diags {
		key, ok := strings.CutPrefix(d.Object, "NetworkPolicy ")
		if !ok {
			continue
		}
		msg := d.Message
		if d.Field != "" {
			msg = d.Field + ": " + msg
		}
		byObject[key] = append(byObject[key], msg)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]string{}
	for key, msgs := range byObject {
		np, ok := p.nps[key]
		if !ok {
			continue
		}
		for _, m := range msgs {
			id := problemID(key, np.Generation, m)
			seen[id] = ""
			if _, done := w.emitted[id]; done {
				continue
			}
			if w.recorder != nil {
				gen := map[string]string{annotationGeneration: strconv.FormatInt(np.Generation, 10)}
				w.recorder.AnnotatedEventf(npRef(np), gen, corev1.EventTypeWarning, EventPolicyProblem, "%s", truncate(m))
			}
		}
	}
	w.emitted = seen
}

// nodeFailed reports that this node could not program its rules: a Warning
// Event on the Node, once per failure streak (any agent, not only the
// leader: the failure is this node's). Not on the ClusterNetworkPolicies:
// a failure common to many nodes (a kernel without a needed nft feature on
// a node pool) would make nodes × policies Events, and `kubectl describe`
// of a policy would list every failing node; the Node Event, the
// moat_agent_syncs_total error count and /readyz say where it failed.
func (w *statusWriter) nodeFailed(err error) {
	msg := fmt.Sprintf("node %s could not program its nftables rules; the previous rules stay in force: %v", w.a.cfg.NodeName, err)
	w.event(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: w.a.cfg.NodeName, UID: types.UID(w.a.cfg.NodeName)}, corev1.EventTypeWarning, EventNodeSyncFailed, msg)
}
