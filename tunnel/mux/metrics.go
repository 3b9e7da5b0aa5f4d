package mux

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/tunnel/proto"
)

// Metrics are the tunnel counters shared by server and agent. All methods
// accept a nil receiver so that tests may leave metrics out.
type Metrics struct {
	BadPackets   *prometheus.CounterVec
	Connections  *prometheus.CounterVec
	DialLatency  *prometheus.HistogramVec
	Open         *prometheus.GaugeVec
	Bytes        *prometheus.CounterVec
	PendingDials prometheus.Gauge
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		BadPackets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_tunnel_bad_packets_total",
			Help: "Packets dropped or connections closed because of bad input, by reason.",
		}, []string{"reason"}),
		Connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_tunnel_connections_total",
			Help: "Tunneled connection attempts by direction and outcome.",
		}, []string{"direction", "outcome"}),
		DialLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "moat_tunnel_dial_duration_seconds",
			Help:    "Time from DIAL_REQ to DIAL_RSP, by direction.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"direction"}),
		Open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "moat_tunnel_open_connections",
			Help: "Open tunneled connections by direction.",
		}, []string{"direction"}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_tunnel_bytes_total",
			Help: "Payload bytes carried on agent tunnels, by direction and whether this process sent or received them.",
		}, []string{"direction", "way"}),
		PendingDials: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "moat_tunnel_pending_dials",
			Help: "Dials requested by the peer and not yet answered.",
		}),
	}
	reg.MustRegister(m.BadPackets, m.Connections, m.DialLatency, m.Open, m.Bytes, m.PendingDials)
	return m
}

// Direction names the flow of a connection for metric labels.
func Direction(o proto.Origin) string {
	if o == proto.OriginNode {
		return "node-to-control-plane"
	}
	return "control-plane-to-node"
}

func (m *Metrics) badPacket(reason string) {
	if m != nil {
		m.BadPackets.WithLabelValues(reason).Inc()
	}
}

// BadPacket counts bad input seen outside a session (frontends).
func (m *Metrics) BadPacket(reason string) { m.badPacket(reason) }

func (m *Metrics) dial(o proto.Origin, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.Connections.WithLabelValues(Direction(o), outcome).Inc()
	if outcome == "ok" {
		m.DialLatency.WithLabelValues(Direction(o)).Observe(d.Seconds())
	}
}

// requested records the outcome of a dial this side asked for; with dial it
// counts every connection once per process (each process is the requester of
// one direction and the dialer of the other).
func (m *Metrics) requested(o proto.Origin, outcome string, d time.Duration) {
	m.dial(o, outcome, d)
}

// Refused counts a dial refused by policy (not by the network).
func (m *Metrics) Refused(o proto.Origin) {
	if m != nil {
		m.Connections.WithLabelValues(Direction(o), "refused").Inc()
	}
}

func (m *Metrics) open(o proto.Origin, d float64) {
	if m != nil {
		m.Open.WithLabelValues(Direction(o)).Add(d)
	}
}

func (m *Metrics) bytes(o proto.Origin, way string, n int) {
	if m != nil {
		m.Bytes.WithLabelValues(Direction(o), way).Add(float64(n))
	}
}

func (m *Metrics) pendingDials(d float64) {
	if m != nil {
		m.PendingDials.Add(d)
	}
}
