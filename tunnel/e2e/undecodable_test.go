package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	gproto "google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// rawCodec sends []byte messages as they are, bytes a Go protobuf encoder
// would refuse to produce, and decodes what it receives as Packets.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case []byte:
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	case gproto.Message:
		b, err := gproto.Marshal(m)
		return mem.BufferSlice{mem.SliceBuffer(b)}, err
	}
	return nil, fmt.Errorf("rawCodec: %T", v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return gproto.Unmarshal(data.Materialize(), v.(gproto.Message))
}

// notAPacket is a DIAL_REQ whose address is not UTF-8, which no Go
// protobuf decoder accepts as a Packet.
func notAPacket() []byte {
	var dr []byte
	dr = protowire.AppendTag(dr, 1, protowire.BytesType)
	dr = protowire.AppendString(dr, "tcp")
	dr = protowire.AppendTag(dr, 2, protowire.BytesType)
	dr = protowire.AppendBytes(dr, []byte("10.0.0.1:\xff"))
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(client.PacketType_DIAL_REQ))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, dr)
}

// rawStream opens a stream of method on addr that sends raw bytes.
func rawStream(t *testing.T, addr, method string, creds credentials.TransportCredentials, md metadata.MD) grpc.ClientStream {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	t.Cleanup(cancel)
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestUndecodableMessage: a message on a tunnel stream that is not a
// Packet is a protocol error. On an agent stream it ends that stream with
// InvalidArgument naming the cause (it used to end with a bare OK, or
// gRPC's Internal, and no count), never the other agents' tunnels; on a
// kube-apiserver Proxy stream it ends that one connection the same way.
// Packets that decode but are bad are TestBadInput's and the mux tests'.
func TestUndecodableMessage(t *testing.T) {
	p := newPKI(t)
	reg := prometheus.NewRegistry()
	ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: reg, Strategies: []server.Strategy{server.StrategyDestHost}}})
	hs := httpBackend(t)
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Identifiers = "ipv4=127.0.0.1" })
	eventually(t, "agent tunnel", ps.srv.Ready)

	rogue := rawStream(t, ps.agentAddr, proto.ConnectMethod, agentCreds(t, p, p.agent), metadata.Pairs(proto.MetaAgentID, "rogue"))
	if _, err := rogue.Header(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rogue tunnel", func() bool { return ps.srv.Backends() == 2 })
	if err := rogue.SendMsg(notAPacket()); err != nil {
		t.Fatal(err)
	}
	var pk client.Packet
	if err := rogue.RecvMsg(&pk); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "undecodable packet") {
		t.Fatalf("agent stream after a message that is not a packet: %v, want InvalidArgument naming it", err)
	}
	eventually(t, "rogue removed", func() bool { return ps.srv.Backends() == 1 })

	front := rawStream(t, ps.frontAddr, "/ProxyService/Proxy", credentialsTLS(t, p), nil)
	if err := front.SendMsg(notAPacket()); err != nil {
		t.Fatal(err)
	}
	if err := front.RecvMsg(&pk); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "undecodable packet") {
		t.Fatalf("proxy stream after a message that is not a packet: %v, want InvalidArgument naming it", err)
	}
	if got := metricValue(t, reg, "moat_tunnel_bad_packets_total", map[string]string{"reason": "undecodable"}); got != 2 {
		t.Errorf("bad_packets{reason=undecodable} = %v, want 2", got)
	}
	got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
		return grpcDial(ctx, t, p, ps.frontAddr, addr)
	}, hs.URL+"/still")
	if got != "hello /still" {
		t.Fatalf("good agent after the rogue's protocol error: %q", got)
	}
}
