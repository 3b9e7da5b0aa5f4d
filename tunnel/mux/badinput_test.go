package mux

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/proto"
)

// badPackets reads moat_tunnel_bad_packets_total{reason}.
func badPackets(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "moat_tunnel_bad_packets_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// undecodableDialReq is a DIAL_REQ whose address is not UTF-8: protobuf
// refuses a proto3 string that is not, so the message is not a Packet to
// any Go peer (Moat's or upstream's), though a peer in another language
// could send it.
func undecodableDialReq() []byte {
	var dr []byte
	dr = protowire.AppendTag(dr, 1, protowire.BytesType) // protocol
	dr = protowire.AppendString(dr, "tcp")
	dr = protowire.AppendTag(dr, 2, protowire.BytesType) // address
	dr = protowire.AppendBytes(dr, []byte("10.0.0.1:\xff\xfe"))
	dr = protowire.AppendTag(dr, 3, protowire.VarintType) // random
	dr = protowire.AppendVarint(dr, 77)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType) // type
	b = protowire.AppendVarint(b, uint64(client.PacketType_DIAL_REQ))
	b = protowire.AppendTag(b, 2, protowire.BytesType) // dialRequest
	return protowire.AppendBytes(b, dr)
}

// Packets that decode but are bad (an unknown type, a payload missing, a
// bad extension field, DATA, CLOSE_RSP, DIAL_RSP or DIAL_CLS for
// connections this side does not know) are dropped or answered one at a
// time: an open connection of the same stream goes on. A message that is
// not a packet at all ends the stream, since which connection it belonged
// to is unknown (it might have been that connection's data or its close):
// Run returns ErrUndecodable, the open connection fails rather than
// silently missing bytes, and the drop is counted.
func TestBadPacketsSpareOtherConnections(t *testing.T) {
	a, peer := pair()
	reg := prometheus.NewRegistry()
	s := New(a, Config{LocalOrigin: proto.OriginControlPlane, Metrics: NewMetrics(reg)})
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(context.Background()) }()
	t.Cleanup(func() { peer.close() })

	go func() { // the peer answers the dial as connection 1
		p, err := peer.Recv()
		if err == nil && p.Type == client.PacketType_DIAL_REQ {
			peer.Send(proto.DialRsp(proto.OriginControlPlane, p.GetDialRequest().Random, 1, ""))
		}
	}()
	c, err := s.Dial(context.Background(), "192.0.2.1:22")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	badExt := proto.Data(proto.OriginControlPlane, 1, []byte("x"))
	badExt.ProtoReflect().SetUnknown([]byte{0x4a, 0x01, 0x00}) // field 9 as bytes
	for _, p := range []*client.Packet{
		{Type: 42},                          // unknown type
		{Type: client.PacketType_CLOSE_REQ}, // no payload
		badExt,                              // bad extension field
		proto.Data(proto.OriginControlPlane, 77, []byte("stray")), // unknown connection
		proto.CloseRsp(proto.OriginControlPlane, 78, ""),          // unknown connection
		proto.DialRsp(proto.OriginControlPlane, 12345, 79, ""),    // unknown dial
		{Type: client.PacketType_DIAL_CLS, Payload: &client.Packet_CloseDial{CloseDial: &client.CloseDial{Random: 999}}},
		proto.Data(proto.OriginControlPlane, 1, []byte("still here")), // the open connection's data
	} {
		if err := peer.Send(p); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, len("still here"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "still here" {
		t.Fatalf("open connection after bad packets: read %q, %v", buf, err)
	}
	for _, r := range []string{"unknown_type", "malformed_CLOSE_REQ", "bad_extension"} {
		if v := badPackets(t, reg, r); v != 1 {
			t.Errorf("bad_packets{reason=%q} = %v, want 1", r, v)
		}
	}

	peer.out <- mem.BufferSlice{mem.SliceBuffer(undecodableDialReq())}
	if err := <-runErr; !errors.Is(err, proto.ErrUndecodable) {
		t.Fatalf("Run after an undecodable message: %v, want ErrUndecodable", err)
	}
	if _, err := c.Read(buf); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("open connection after the stream ended: read error %v, want ErrSessionClosed", err)
	}
	if v := badPackets(t, reg, "undecodable"); v != 1 {
		t.Errorf("bad_packets{reason=undecodable} = %v, want 1", v)
	}
}
