package mux

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/proto"
)

// recorder is a Stream that remembers the type and connection of every
// packet sent, in order.
type recorder struct {
	Stream
	mu   sync.Mutex
	sent []sentPacket
}

type sentPacket struct {
	typ client.PacketType
	id  int64
}

func (r *recorder) SendMsg(m any) error {
	var sp sentPacket
	switch p := m.(type) {
	case *proto.OutData:
		sp = sentPacket{client.PacketType_DATA, p.ConnectID}
	case *client.Packet:
		sp.typ = p.Type
		switch p.Type {
		case client.PacketType_DIAL_RSP:
			sp.id = p.GetDialResponse().ConnectID
		case client.PacketType_DATA:
			sp.id = p.GetData().ConnectID
		case client.PacketType_CLOSE_RSP:
			sp.id = p.GetCloseResponse().ConnectID
		case client.PacketType_CLOSE_REQ:
			sp.id = p.GetCloseRequest().ConnectID
		}
	}
	r.mu.Lock()
	r.sent = append(r.sent, sp)
	r.mu.Unlock()
	return r.Stream.SendMsg(m)
}

// run starts a session over st until the test ends.
func run(t *testing.T, st *chanStream, s *Session) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); st.close(); <-done })
}

func tcpDial(ctx context.Context, _ proto.Origin, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// speaker writes msg to every connection as soon as it is accepted, then
// closes it: the first bytes and the close come from the dialed side.
func speaker(t *testing.T, msg string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, msg)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += value(m)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// The dialing side sends DIAL_RSP before the connection's first DATA and
// DATA before CLOSE_RSP, even when the destination writes and closes at
// once; the requester gets every byte and sees no unknown connection.
func TestPacketsOfAConnectionInOrder(t *testing.T) {
	for _, credit := range []bool{true, false} {
		a, b := pair()
		rec := &recorder{Stream: b}
		reqReg, diaReg := prometheus.NewRegistry(), prometheus.NewRegistry()
		req := New(a, Config{LocalOrigin: proto.OriginControlPlane, Credit: credit, Metrics: NewMetrics(reqReg)})
		dia := New(rec, Config{LocalOrigin: proto.OriginNode, Credit: credit, Dial: tcpDial, Metrics: NewMetrics(diaReg)})
		run(t, a, req)
		run(t, b, dia)
		addr := speaker(t, "220 hello\r\n")
		const n = 200
		for i := range n {
			c, err := req.Dial(context.Background(), addr)
			if err != nil {
				t.Fatalf("dial %d: %v", i, err)
			}
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "220 hello\r\n" {
				t.Fatalf("credit=%v connection %d: got %q, %v", credit, c.ID(), got, err)
			}
			c.Close()
		}
		rec.mu.Lock()
		sent := append([]sentPacket(nil), rec.sent...)
		rec.mu.Unlock()
		state := map[int64]client.PacketType{} // last packet type sent per connection
		for i, p := range sent {
			if p.id == 0 {
				continue
			}
			last, seen := state[p.id]
			switch {
			case p.typ == client.PacketType_DIAL_RSP && seen:
				t.Fatalf("credit=%v packet %d: DIAL_RSP of connection %d after %s", credit, i, p.id, last)
			case p.typ != client.PacketType_DIAL_RSP && !seen:
				t.Fatalf("credit=%v packet %d: %s of connection %d before its DIAL_RSP", credit, i, p.typ, p.id)
			case last == client.PacketType_CLOSE_RSP:
				t.Fatalf("credit=%v packet %d: %s of connection %d after its CLOSE_RSP", credit, i, p.typ, p.id)
			}
			state[p.id] = p.typ
		}
		if len(state) != n {
			t.Fatalf("credit=%v: %d connections answered, want %d", credit, len(state), n)
		}
		for name, reg := range map[string]*prometheus.Registry{"requester": reqReg, "dialer": diaReg} {
			if v := gauge(t, reg, "moat_tunnel_bad_packets_total"); v != 0 {
				t.Errorf("credit=%v %s: %v bad packets", credit, name, v)
			}
			deadline := time.Now().Add(10 * time.Second)
			for gauge(t, reg, "moat_tunnel_open_connections") != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if v := gauge(t, reg, "moat_tunnel_open_connections"); v != 0 {
				t.Errorf("credit=%v %s: open connections gauge stuck at %v", credit, name, v)
			}
		}
	}
}

// A connection the peer closes right after answering the dial is still
// handed to the requester and released when it closes it: the gauge and
// Active return to 0 (they used to leak one per such connection).
func TestCloseRightAfterDialRsp(t *testing.T) {
	a, peer := pair()
	reg := prometheus.NewRegistry()
	req := New(a, Config{LocalOrigin: proto.OriginControlPlane, Metrics: NewMetrics(reg)})
	run(t, a, req)
	go func() { // the peer answers every dial and closes it at once
		var id int64
		for {
			p, err := peer.Recv()
			if err != nil {
				return
			}
			if p.Type != client.PacketType_DIAL_REQ {
				continue
			}
			id++
			peer.Send(proto.DialRsp(proto.OriginControlPlane, p.GetDialRequest().Random, id, ""))
			peer.Send(proto.CloseRsp(proto.OriginControlPlane, id, ""))
		}
	}()
	for i := range 200 {
		c, err := req.Dial(context.Background(), "192.0.2.1:22")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
			t.Fatalf("dial %d: read %q %v, want EOF", i, b, err)
		}
		c.Close()
	}
	if n := req.Active(); n != 0 {
		t.Errorf("Active() = %d after every connection closed", n)
	}
	if v := gauge(t, reg, "moat_tunnel_open_connections"); v != 0 {
		t.Errorf("open connections gauge = %v after every connection closed", v)
	}
}
