package proto

import (
	"bytes"
	"testing"

	gproto "google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// A control-plane packet must be byte-identical to upstream's, so stock
// peers never see the extension.
func TestExtInvisibleByDefault(t *testing.T) {
	stock := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 3, Data: []byte("hi")}}}
	ours := Data(OriginControlPlane, 3, []byte("hi"))
	a, _ := gproto.Marshal(stock)
	b, _ := gproto.Marshal(ours)
	if !bytes.Equal(a, b) {
		t.Fatalf("control-plane DATA differs from upstream: %x vs %x", a, b)
	}
}

func TestExtRoundTrip(t *testing.T) {
	cases := []Ext{{}, {Origin: OriginNode}, {Credit: 1 << 20}, {Origin: OriginNode, Credit: 7}, {Fin: true}, {Origin: OriginNode, Fin: true}}
	for _, e := range cases {
		p := Data(OriginControlPlane, 1, nil)
		SetExt(p, e)
		b, err := gproto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		// A stock decoder accepts it and keeps the payload.
		var q client.Packet
		if err := gproto.Unmarshal(b, &q); err != nil {
			t.Fatal(err)
		}
		if q.GetData().GetConnectID() != 1 {
			t.Fatalf("payload lost: %v", &q)
		}
		got, err := GetExt(&q)
		if err != nil || got != e {
			t.Fatalf("GetExt = %+v, %v; want %+v", got, err, e)
		}
	}
}

func TestExtMalformed(t *testing.T) {
	for name, raw := range map[string][]byte{
		"origin as bytes":  {0x4a, 0x01, 0x00},
		"origin 2":         {0x48, 0x02},
		"truncated varint": {0x48, 0x80},
		"bad tag":          {0x00},
		"fin 2":            {0x58, 0x02},
		"fin as bytes":     {0x5a, 0x01, 0x00},
	} {
		p := &client.Packet{}
		p.ProtoReflect().SetUnknown(raw)
		if _, err := GetExt(p); err == nil {
			t.Errorf("%s: want error", name)
		}
	}
	// Other unknown fields are skipped (forward compatibility).
	p := &client.Packet{}
	p.ProtoReflect().SetUnknown([]byte{0x60, 0x05, 0x48, 0x01}) // field 12 = 5, field 9 = 1
	if e, err := GetExt(p); err != nil || e.Origin != OriginNode {
		t.Fatalf("got %+v %v", e, err)
	}
}

func FuzzGetExt(f *testing.F) {
	f.Add([]byte{0x48, 0x01, 0x50, 0x80, 0x80, 0x40})
	f.Add([]byte{0x4a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p client.Packet
		if err := gproto.Unmarshal(raw, &p); err != nil {
			return
		}
		_ = Check(&p)
		_, _ = GetExt(&p)
	})
}

func TestCheck(t *testing.T) {
	good := []*client.Packet{DialReq(OriginNode, "a:1", 1), DialRsp(0, 1, 2, ""), Data(0, 1, nil), CloseReq(0, 1), CloseRsp(0, 1, ""), DialCls(0, 1), Drain(),
		{Type: client.PacketType_DRAIN}}
	for _, p := range good {
		if err := Check(p); err != nil {
			t.Errorf("%v: %v", p, err)
		}
	}
	bad := []*client.Packet{nil, {}, {Type: 99}, {Type: client.PacketType_DATA}, Data(0, 0, nil), CloseReq(0, 0), CloseRsp(0, 0, ""),
		{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "udp", Address: "a:1"}}},
		{Type: client.PacketType_DATA, Payload: &client.Packet_CloseRequest{CloseRequest: &client.CloseRequest{ConnectID: 1}}}}
	for _, p := range bad {
		if err := Check(p); err == nil {
			t.Errorf("%v: want error", p)
		}
	}
}
