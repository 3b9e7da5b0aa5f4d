package agent

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/nft"
)

// DropCounterReader is the optional part of a Dataplane that reads what
// its drop rules counted; *nft.Syncer has it. A Dataplane without it
// exports no drop metrics.
type DropCounterReader interface {
	Counters(ctx context.Context) ([]nft.DropCounter, error)
}

// dropPeriod is how often the counters are read besides after each
// sync: a Prometheus scrape interval, so that a scrape sees at most one
// period of lag.
const dropPeriod = 15 * time.Second

// dropLabels are the labels of the drop series. name joins the names
// when several NetworkPolicies isolate the same pods; rule is empty when
// the drop is no single rule's (isolation, fixed drops).
var dropLabels = []string{"kind", "namespace", "name", "direction", "rule", "reason"}

// drops reads the dataplane's drop counters and exports the last reading.
// The series are the counters of the ruleset last programmed: one per
// ClusterNetworkPolicy Deny rule and per set of isolating NetworkPolicies
// that the node's pods use, plus the fixed drops, so their number is
// bounded by the node's rules, and a series disappears with its rule.
// They are counters because the kernel's are monotonic: patches never
// touch them and a full replace of the table carries them over (only
// drops in the moment between reading and replacing are lost).
type drops struct {
	reader DropCounterReader
	log    klog.Logger
	errors prometheus.Counter

	packets, bytes *prometheus.Desc
	poked          chan struct{}

	// series are the last reading, summed by labels when it is taken:
	// scrapes (every few seconds, from each Prometheus replica) send them
	// as they are instead of summing ~1,600 series again each time. They
	// are kept as label values and counts, and made into metrics only
	// while a scrape writes them: ready-made const metrics (a packets and
	// a bytes one per series, each with six label pairs of its own) held
	// 1.3 MB at the 30,000-pod benchmark, all the time, for what a scrape
	// builds in a millisecond.
	mu     sync.Mutex
	series []dropSeries
}

// dropSeries is one series of a reading: its dropLabels values and the
// counts of the counters that map to them.
type dropSeries struct {
	labels         []string
	packets, bytes uint64
	// fixed: one of the ruleset's fixed drops (no policy's), exported
	// at zero too.
	fixed bool
}

// dropMetric is one of a series' two metrics as a scrape writes it.
type dropMetric struct {
	desc  *prometheus.Desc
	s     *dropSeries
	value uint64
}

func (m dropMetric) Desc() *prometheus.Desc { return m.desc }

// Write implements prometheus.Metric as a const counter does.
func (m dropMetric) Write(out *dto.Metric) error {
	v := float64(m.value)
	out.Label = prometheus.MakeLabelPairs(m.desc, m.s.labels)
	out.Counter = &dto.Counter{Value: &v}
	return nil
}

func newDrops(dp Dataplane, reg prometheus.Registerer, log klog.Logger) *drops {
	d := &drops{
		poked: make(chan struct{}, 1),
		log:   log,
		packets: prometheus.NewDesc("moat_agent_dropped_packets_total",
			"Packets the node's rules dropped, by policy (kind, namespace, name), direction, rule index and reason (deny, fail_closed, isolation, invalid, not_syn, conflict, spoofed, unknown_destination, link_scope); read from nftables counters.",
			dropLabels, nil),
		bytes: prometheus.NewDesc("moat_agent_dropped_bytes_total",
			"Bytes (layer 3) of the packets counted in moat_agent_dropped_packets_total.",
			dropLabels, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moat_agent_drop_counter_read_errors_total",
			Help: "Failed reads of the nftables drop counters; the drop series keep the last reading meanwhile.",
		}),
	}
	d.reader, _ = dp.(DropCounterReader)
	reg.MustRegister(d, d.errors)
	return d
}

// dropSettle is how long the ruleset must stay unchanged before a
// reading follows a sync, and dropMinGap the least time between two
// readings: one reading per burst of syncs, never one per sync. They were
// chosen when a reading ran nft, which loads the whole table and competed
// with the syncs for the CPU (~0.4 s at 30,000 pods); a reading is now a
// netlink dump of the counters (4-6 ms there, nft.NetlinkCounters), and the
// spacing is kept for what it still bounds at the cost of 2 s of lag.
const (
	dropSettle = time.Second
	dropMinGap = 2 * time.Second
)

// run reads the counters every dropPeriod, and dropSettle after the last
// of a run of syncs, at most once per dropMinGap, until ctx ends.
func (d *drops) run(ctx context.Context) {
	if d.reader == nil {
		return
	}
	t := time.NewTicker(dropPeriod)
	defer t.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.poked:
			settle.Reset(max(dropSettle, dropMinGap-time.Since(last)))
			continue
		case <-settle.C:
		case <-t.C:
		}
		d.read(ctx)
		last = time.Now()
	}
}

// poke asks for a reading soon: the ruleset changed, so series may have
// come or gone. Pokes made while one is pending fold into it.
func (d *drops) poke() {
	select {
	case d.poked <- struct{}{}:
	default:
	}
}

// read takes one reading.
func (d *drops) read(ctx context.Context) {
	if d.reader == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs, err := d.reader.Counters(rctx)
	if err != nil {
		if ctx.Err() == nil {
			d.errors.Inc()
			d.log.Error(err, "Reading drop counters failed; metrics keep the last reading")
		}
		return
	}
	series := seriesOf(cs)
	d.mu.Lock()
	d.series = series
	d.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (d *drops) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.packets
	ch <- d.bytes
}

// Collect implements prometheus.Collector: the last reading.
func (d *drops) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	series := d.series
	d.mu.Unlock()
	for i := range series {
		s := &series[i]
		if s.packets == 0 && !s.fixed {
			// A policy rule's series appears with its first drop: a
			// node exports its rules' counters, ~1,600 series at the
			// 30,000-pod benchmark, nearly all zero, millions across a
			// large cluster's nodes.
			continue
		}
		ch <- dropMetric{d.packets, s, s.packets}
		ch <- dropMetric{d.bytes, s, s.bytes}
	}
}

// seriesOf sums a reading's counters that map to the same labels, in
// the order their labels first come.
func seriesOf(cs []nft.DropCounter) []dropSeries {
	var out []dropSeries
	index := map[string]int{}
	for _, c := range cs {
		l := dropLabelValues(c)
		k := strings.Join(l, "\x00")
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, dropSeries{labels: l, fixed: len(c.Policies) == 0})
		}
		out[i].packets += c.Packets
		out[i].bytes += c.Bytes
	}
	return slices.Clip(out)
}

// dropLabelValues are the values of dropLabels for one counter.
func dropLabelValues(c nft.DropCounter) []string {
	var kinds, namespaces, names []string
	for _, p := range c.Policies {
		kinds = append(kinds, p.Kind)
		namespaces = append(namespaces, p.Namespace)
		names = append(names, p.Name)
	}
	rule := ""
	if c.Rule >= 0 {
		rule = strconv.Itoa(c.Rule)
	}
	return []string{joinUnique(kinds), joinUnique(namespaces), strings.Join(names, ","), c.Direction, rule, c.Reason}
}

// joinUnique joins the distinct non-empty values, in order, with commas.
func joinUnique(vals []string) string {
	var out []string
	for _, v := range vals {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return strings.Join(out, ",")
}
