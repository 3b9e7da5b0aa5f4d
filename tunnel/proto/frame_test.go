package proto

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	gproto "google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// testPool hands out plain slices; mem.Buffer panics on any use after the
// last Free, which is what these tests rely on to catch a missing Ref.
type testPool struct{}

func (testPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (testPool) Put(*[]byte)       {}

// chop splits wire into buffers of size n, as HTTP/2 frames split a message.
func chop(wire []byte, n int) mem.BufferSlice {
	var bs mem.BufferSlice
	for len(wire) > 0 {
		k := min(n, len(wire))
		b := make([]byte, k)
		copy(b, wire[:k])
		bs = append(bs, mem.NewBuffer(&b, testPool{}))
		wire = wire[k:]
	}
	return bs
}

func payloadOf(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// decodeFrame turns a Frame back into the Packet protobuf would decode.
func decodeFrame(f *Frame) *client.Packet {
	if f.Packet != nil {
		return f.Packet
	}
	p := Data(f.Ext.Origin, f.ConnectID, f.Payload.Materialize())
	if f.Ext.Credit != 0 {
		SetExt(p, f.Ext)
	}
	return p
}

// Every encoding of a DATA packet, cut into frames anywhere, decodes to what
// protobuf decodes; large ones keep their payload in the receive buffers,
// which stay valid after the caller frees its own references.
func TestFrameDecodesLikeProtobuf(t *testing.T) {
	for _, size := range []int{0, 1, 100, 4095, 4096, 20000, 16 << 10, 200000} {
		for _, origin := range []Origin{OriginControlPlane, OriginNode} {
			pl := payloadOf(size)
			encodings := map[string][]byte{}
			od := &OutData{Origin: origin, ConnectID: 1<<40 + 3, Payload: mem.BufferSlice{mem.SliceBuffer(pl)}}
			encodings["OutData"] = od.Marshal().Materialize()
			std, err := gproto.Marshal(Data(origin, 1<<40+3, pl))
			if err != nil {
				t.Fatal(err)
			}
			encodings["protobuf"] = std
			for name, wire := range encodings {
				want := new(client.Packet)
				if err := gproto.Unmarshal(wire, want); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for _, frame := range []int{1, 7, 16 << 10, len(wire) + 1} {
					what := fmt.Sprintf("%s size=%d origin=%s frames of %d", name, size, origin, frame)
					data := chop(wire, frame)
					var f Frame
					if err := f.Unmarshal(data, testPool{}); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					data.Free()
					if fast := f.Packet == nil; fast != (len(wire) >= fastPathMin) {
						t.Errorf("%s: fast path %v", what, fast)
					}
					got := decodeFrame(&f)
					if !gproto.Equal(got, want) {
						t.Errorf("%s: decoded %v, want %v", what, got, want)
					}
					if f.Packet == nil && !bytes.Equal(f.Payload.Materialize(), pl) {
						t.Errorf("%s: payload differs", what)
					}
					f.Payload.Free()
				}
			}
		}
	}
}

// Shapes the fast path does not take are decoded by protobuf (an error
// text, a type other than DATA, fields in another order, unknown fields).
func TestFrameFallsBack(t *testing.T) {
	big := payloadOf(64 << 10)
	withErr := Data(OriginControlPlane, 5, big)
	withErr.GetData().Error = "boom"
	notData := &client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 5, Data: big}}}
	unknown := Data(OriginControlPlane, 5, big)
	unknown.ProtoReflect().SetUnknown([]byte{0x58, 0x01}) // field 11 varint
	zeroID := Data(OriginControlPlane, 0, big)
	for name, p := range map[string]*client.Packet{"error": withErr, "not DATA": notData, "unknown field": unknown, "connectID 0": zeroID} {
		wire, err := gproto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var f Frame
		data := chop(wire, 16<<10)
		if err := f.Unmarshal(data, testPool{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		data.Free()
		if f.Packet == nil || !gproto.Equal(f.Packet, p) {
			t.Errorf("%s: fast path taken or packet changed", name)
		}
	}
}

// FuzzFrame: whatever the bytes and wherever they are cut, Frame decodes
// exactly what protobuf decodes, or fails where protobuf fails.
func FuzzFrame(f *testing.F) {
	od := &OutData{Origin: OriginNode, ConnectID: 9, Payload: mem.BufferSlice{mem.SliceBuffer(payloadOf(5000))}}
	f.Add(od.Marshal().Materialize(), 100)
	std, _ := gproto.Marshal(Data(OriginControlPlane, 3, payloadOf(9000)))
	f.Add(std, 4096)
	f.Fuzz(func(t *testing.T, wire []byte, cut int) {
		want := new(client.Packet)
		werr := gproto.Unmarshal(wire, want)
		var fr Frame
		data := chop(wire, max(1, cut%(len(wire)+1)))
		err := fr.Unmarshal(data, testPool{})
		data.Free()
		if (err != nil) != (werr != nil) {
			t.Fatalf("Frame error %v, protobuf error %v", err, werr)
		}
		if err != nil {
			return
		}
		if fr.Packet == nil {
			// The fast path keeps only Moat's two fields besides the packet;
			// protobuf keeps them as unknown bytes.
			ext, xerr := GetExt(want)
			if xerr != nil || ext != fr.Ext || want.Type != client.PacketType_DATA || want.GetData().ConnectID != fr.ConnectID ||
				!bytes.Equal(want.GetData().Data, fr.Payload.Materialize()) || want.GetData().Error != "" {
				t.Fatalf("fast path decoded %+v, protobuf %v", fr, want)
			}
		}
		fr.Payload.Free()
	})
}
