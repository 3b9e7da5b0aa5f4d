package grpcbuf

import (
	"errors"
	"testing"

	"google.golang.org/grpc/mem"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	tproto "github.com/moat-net/moat/tunnel/proto"
)

func TestPool(t *testing.T) {
	p := New()
	for _, n := range []int{0, 1, 256, 257, 131100, 4 << 20, 5 << 20} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d) has length %d", n, len(*b))
		}
		if i := tier(n); i >= 0 && cap(*b) != sizes[i] {
			t.Fatalf("Get(%d) has capacity %d, want %d", n, cap(*b), sizes[i])
		}
		p.Put(b)
	}
	odd := make([]byte, 10, 1000)
	p.Put(&odd) // foreign capacity: dropped, never handed out
	if b := p.Get(999); cap(*b) == 1000 {
		t.Fatal("foreign buffer reused")
	}
}

func TestCodecRoundTrip(t *testing.T) {
	c := Codec{Pool: New()}
	in := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 9, Data: make([]byte, 200<<10)}}}
	in.GetData().Data[1234] = 7
	bs, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out client.Packet
	if err := c.Unmarshal(bs, &out); err != nil {
		t.Fatal(err)
	}
	bs.Free()
	if out.GetData().GetConnectID() != 9 || len(out.GetData().Data) != 200<<10 || out.GetData().Data[1234] != 7 {
		t.Fatal("round trip changed the packet")
	}
	// Reused buffers must not leak into decoded messages.
	bs2, _ := c.Marshal(&client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 1, Data: []byte("x")}}})
	bs2.Free()
	if out.GetData().Data[1234] != 7 {
		t.Fatal("decoded message aliases a pooled buffer")
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("want error for a non-message")
	}
}

// A message that is not a Packet does not fail the receive: the Frame
// carries the error (proto.ErrUndecodable) for the receiver to act on.
func TestCodecUndecodableFrame(t *testing.T) {
	c := Codec{Pool: New()}
	var f tproto.Frame
	// Field 1 with wire type 7, which does not exist.
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0f, 0x01})}, &f); err != nil {
		t.Fatalf("Unmarshal failed the receive: %v", err)
	}
	if !errors.Is(f.Err, tproto.ErrUndecodable) || f.Packet != nil || f.Payload != nil {
		t.Fatalf("frame %+v, want only Err wrapping ErrUndecodable", f)
	}
	var p client.Packet // other messages still fail as before
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0f, 0x01})}, &p); err == nil {
		t.Fatal("Unmarshal into a Packet accepted garbage")
	}
}
