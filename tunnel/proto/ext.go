package proto

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Origin says which side asked for a connection. Connection IDs are chosen by
// the side that makes the real TCP dial, so the two directions of KEP-2025
// each have their own ID space on one agent stream; the origin tells them apart.
type Origin uint8

const (
	// OriginControlPlane marks connections requested by the control plane
	// (kube-apiserver -> node). It is the zero value and is never written on
	// the wire, so stock peers see byte-identical upstream packets.
	OriginControlPlane Origin = 0
	// OriginNode marks connections requested by a node client (KEP-2025,
	// node -> control plane). Only a Moat agent with the feature gate on
	// creates such connections, so stock peers never receive the marker.
	OriginNode Origin = 1
)

func (o Origin) String() string {
	switch o {
	case OriginControlPlane:
		return "control-plane"
	case OriginNode:
		return "node"
	default:
		return fmt.Sprintf("origin(%d)", uint8(o))
	}
}

// Field numbers of Moat's extension. They are unused by upstream's Packet and
// travel as unknown fields, which protobuf decoders skip.
const (
	FieldOrigin protowire.Number = 9
	FieldCredit protowire.Number = 10
	// FieldFin (varint 1) on an empty DATA packet says the sender has
	// finished sending on that connection (its local side half-closed);
	// only sent to a peer that announced FeatureHalfClose.
	FieldFin protowire.Number = 11
)

// Ext is Moat's extension as carried by one packet.
type Ext struct {
	Origin Origin
	// Credit, when non-zero, makes a DATA packet a window update: the
	// receiver may send Credit more bytes on that connection.
	Credit uint64
	// Fin marks a DATA packet as the sender's last (TCP half-close): the
	// receiver delivers what it has queued, then shuts down the write side
	// of its local socket.
	Fin bool
}

// SetExt writes e into p's unknown fields, replacing earlier Moat fields.
// Zero values are omitted so that a default packet stays upstream-identical.
func SetExt(p *client.Packet, e Ext) {
	var b []byte
	if e.Origin != OriginControlPlane {
		b = protowire.AppendTag(b, FieldOrigin, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(e.Origin))
	}
	if e.Credit != 0 {
		b = protowire.AppendTag(b, FieldCredit, protowire.VarintType)
		b = protowire.AppendVarint(b, e.Credit)
	}
	if e.Fin {
		b = protowire.AppendTag(b, FieldFin, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	p.ProtoReflect().SetUnknown(b)
}

// GetExt reads Moat's extension from p. Unknown fields other than 9, 10 and
// 11 are ignored for forward compatibility; a field 9, 10 or 11 with the
// wrong wire type, an out-of-range origin or a fin other than 0 or 1 is an
// error, so a malformed packet is
// rejected instead of being attributed to the wrong connection.
func GetExt(p *client.Packet) (Ext, error) {
	var e Ext
	b := p.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return Ext{}, fmt.Errorf("packet unknown fields: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch num {
		case FieldOrigin, FieldCredit, FieldFin:
			if typ != protowire.VarintType {
				return Ext{}, fmt.Errorf("packet field %d: wire type %d, want varint", num, typ)
			}
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return Ext{}, fmt.Errorf("packet field %d: %w", num, protowire.ParseError(m))
			}
			b = b[m:]
			switch num {
			case FieldOrigin:
				if v > uint64(OriginNode) {
					return Ext{}, fmt.Errorf("packet field %d: unknown origin %d", num, v)
				}
				e.Origin = Origin(v)
			case FieldCredit:
				e.Credit = v
			default:
				if v > 1 {
					return Ext{}, fmt.Errorf("packet field %d: fin %d, want 0 or 1", num, v)
				}
				e.Fin = v == 1
			}
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return Ext{}, fmt.Errorf("packet field %d: %w", num, protowire.ParseError(m))
			}
			b = b[m:]
		}
	}
	return e, nil
}
