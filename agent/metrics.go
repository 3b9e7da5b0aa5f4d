package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus series, in a registry of its own so
// that several agents (tests, the lab) can live in one process. The
// process and Go runtime series are the binary's (cmd/moat-agent/app).
type metrics struct {
	reg *prometheus.Registry

	syncDuration *prometheus.HistogramVec
	syncs        *prometheus.CounterVec
	resyncs      *prometheus.CounterVec
	compiles     *prometheus.CounterVec
	operations   prometheus.Histogram
	programmed   *prometheus.GaugeVec
	policies     *prometheus.GaugeVec
	changes      prometheus.Counter
	// ignoredRelabels counts pod label changes no selector reads.
	ignoredRelabels prometheus.Counter
	watchErrors     *prometheus.CounterVec
	watchEvents     *prometheus.CounterVec
	problems        *prometheus.GaugeVec
	statusWrites    *prometheus.CounterVec
	conntrack       prometheus.Counter
	// tableMissing counts losses of the table noticed, tableEdited edits
	// of it (tablewatch.go).
	tableMissing, tableEdited prometheus.Counter
	lastSuccess               prometheus.Gauge
	ready                     prometheus.Gauge
	leader                    prometheus.Gauge
	// candidate is 1 while the agent campaigns for the Lease (election.go).
	candidate prometheus.Gauge
}

// Results of a sync, the label of moat_agent_syncs_total.
const (
	resultSuccess = "success"
	// resultError: nftables refused the transaction; the previous rules
	// stay in force and the sync is retried with backoff.
	resultError = "error"
	// resultConntrackError: rules applied, but removing established
	// connections they deny failed.
	resultConntrackError = "conntrack_error"
)

// Outcomes of a resync that programmed the node, the result label of
// moat_agent_resyncs_total besides resultError.
const (
	// resyncReplaced: the whole table was replaced.
	resyncReplaced = "replaced"
	// resyncUnchanged: nftables had not changed since the agent's last
	// commit; the table was patched with what the compilation from
	// scratch changed, usually nothing.
	resyncUnchanged = "unchanged"
)

// watchState adds the event count and staleness series of one
// resource's cache.
func (m *metrics) watchState(s *watchState) {
	s.events = m.watchEvents.WithLabelValues(s.resource)
	labels := prometheus.Labels{"resource": s.resource}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "moat_agent_watch_stale_seconds",
			Help:        "How long the cache of a resource may have been missing changes: 0 while a watch is open, else the time since the last successful list or watch event (since start if none).",
			ConstLabels: labels,
		}, func() float64 { return s.status(time.Now()).Stale.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "moat_agent_watch_last_event_timestamp_seconds",
			Help:        "Unix time of the last successful list, watch start or watch event (bookmarks included) of a resource; 0 before the first.",
			ConstLabels: labels,
		}, func() float64 {
			if c := s.contact.Load(); c != 0 {
				return float64(c) / 1e9
			}
			return 0
		}),
	)
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.syncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "moat_agent_sync_duration_seconds",
		Help:    "Time from reading the caches to nftables holding the result, by phase (compile: snapshot and full or incremental compilation; program: ruleset build and nft transaction; total).",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"phase"})
	m.syncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_syncs_total",
		Help: "Syncs by kind (full: the whole table replaced; diff: a patch) and result (success, error, conntrack_error).",
	}, []string{"kind", "result"})
	m.resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_resyncs_total",
		Help: "Resyncs after the first sync by kind (checked: --resync, which replaces the table only if nftables' generation moved since the agent's last commit; forced: SIGHUP, or table inet moat found missing) and result (replaced, unchanged: patched, error).",
	}, []string{"kind", "result"})
	m.compiles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_compilations_total",
		Help: "Compilations by kind: full (the whole snapshot: first sync, --resync, a policy that reads a new label key) or incremental (the changed objects only).",
	}, []string{"kind"})
	m.operations = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "moat_agent_sync_operations",
		Help:    "Size of each nftables transaction sent (0 when nothing changed).",
		Buckets: prometheus.ExponentialBuckets(1, 4, 10),
	})
	m.programmed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "moat_agent_programmed",
		Help: "What the node's table inet moat holds after the last successful sync, by object (chains, rules, sets, set_elements).",
	}, []string{"object"})
	m.policies = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "moat_agent_policies",
		Help: "Policies in the last compiled program by kind (NetworkPolicy, ClusterNetworkPolicy) and state (accepted; failed_closed: enforced fail-closed because of invalid or unknown fields).",
	}, []string{"kind", "state"})
	m.changes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_agent_changes_applied_total",
		Help: "Changed objects (pods, namespaces, nodes, policies) applied to the program incrementally.",
	})
	m.ignoredRelabels = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_agent_label_changes_ignored_total",
		Help: "Pod label changes dropped before the queue because no policy's selector reads any key that changed.",
	})
	m.watchErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_watch_errors_total",
		Help: "Failed list or watch calls to the API server, by resource. The caches keep their last content meanwhile; transient failures are retried every 250 ms to 3 s.",
	}, []string{"resource"})
	m.watchEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_watch_events_total",
		Help: "Watch events received from the API server, by resource (bookmarks included; the initial lists are not events).",
	}, []string{"resource"})
	m.problems = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "moat_agent_input_problems",
		Help: "Objects in the last snapshot that policy cannot use fully, by problem (pod_without_ip, duplicate_pod_ip, invalid_pod_field, node_without_address, invalid_node_address, undecodable_policy, duplicate_local_address, pod_claims_node_address, node_not_found: no Node is named --node-name, so nothing is programmed).",
	}, []string{"problem"})
	m.statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moat_agent_status_writes_total",
		Help: "ClusterNetworkPolicy status updates sent by the leader, by result (success, conflict, error).",
	}, []string{"result"})
	m.conntrack = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_agent_conntrack_deleted_total",
		Help: "Established connections removed because new rules deny them (--cut-denied-established, and once after the table was found missing or edited, or absent at start).",
	})
	m.tableMissing = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_agent_table_missing_total",
		Help: "Times the agent found its table inet moat gone from nftables (deleted, or the ruleset flushed by another program, as a firewall reload does) and programmed it again. The node enforced nothing in between.",
	})
	m.tableEdited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moat_agent_table_edited_total",
		Help: "Times the agent found its table inet moat edited by another program (a fixed chain flushed, deleted or given other rules, a policy chain's rules or a verdict map's elements added or deleted, a chain added, the table flushed or made dormant) and replaced it. The node's enforcement was undermined in between.",
	})
	m.lastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_agent_last_successful_sync_timestamp_seconds",
		Help: "Unix time of the last sync that left nftables in step with the caches.",
	})
	m.ready = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_agent_ready",
		Help: "1 once the first full sync has been programmed, while the last sync succeeded, the node named --node-name exists and table inet moat is in nftables (see /readyz).",
	})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_agent_leader",
		Help: "1 while this agent holds the status-writer Lease.",
	})
	m.candidate = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moat_agent_leader_candidate",
		Help: "1 while this agent campaigns for the status-writer Lease: one of the --leader-elect-candidates nodes first in hash order, or a stand-in after the Lease was found abandoned.",
	})
	m.reg.MustRegister(m.syncDuration, m.syncs, m.resyncs, m.compiles, m.operations, m.programmed, m.policies, m.changes, m.ignoredRelabels, m.watchErrors, m.watchEvents,
		m.problems, m.statusWrites, m.conntrack, m.tableMissing, m.tableEdited, m.lastSuccess, m.ready, m.leader, m.candidate)
	// At zero from the start, so that rate() and alerts on errors work
	// before the first write.
	for _, r := range []string{"success", "conflict", "error"} {
		m.statusWrites.WithLabelValues(r)
	}
	for _, r := range []string{resultSuccess, resultError, resultConntrackError} {
		for _, k := range []string{"full", "diff"} {
			m.syncs.WithLabelValues(k, r)
		}
	}
	for _, k := range []resyncKind{resyncChecked, resyncForced} {
		for _, r := range []string{resyncReplaced, resyncUnchanged, resultError} {
			if k == resyncForced && r == resyncUnchanged {
				continue
			}
			m.resyncs.WithLabelValues(k.String(), r)
		}
	}
	for _, n := range informerNames {
		m.watchErrors.WithLabelValues(n)
	}
	return m
}
