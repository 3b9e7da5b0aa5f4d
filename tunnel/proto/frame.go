package proto

import (
	"errors"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// The tunnel's bulk traffic is DATA packets. Decoding them with protobuf
// copies the payload out of gRPC's receive buffers into a fresh slice, and
// encoding copies it into a fresh message buffer. Frame and OutData carry
// the payload as gRPC's reference-counted buffers instead: on receive the
// payload is a slice of the buffers the HTTP/2 frames were read into, on
// send the buffer a socket was read into goes to the transport as it is.
// The bytes on the wire are ordinary Packets.

// Frame is one received Packet. Large DATA packets of the usual shape take
// the fast path: Packet is nil and ConnectID, Ext and Payload describe the
// packet, Payload referencing the receive buffers. Everything else is
// decoded into Packet.
type Frame struct {
	Packet    *client.Packet
	ConnectID int64
	Ext       Ext
	// Payload belongs to the receiver, which must Free it.
	Payload mem.BufferSlice
	// Err, wrapping ErrUndecodable, is all a message that is not a Packet
	// leaves: the codec reports it here instead of failing the receive,
	// so that the receiver counts it and ends the stream with a status
	// that says why, instead of gRPC's bare Internal error.
	Err error
}

// ErrUndecodable marks a message on a tunnel stream that does not decode as
// a Packet. It is a protocol error that ends the stream: which connection
// the message belonged to, and what it said, are unknown, so dropping it
// and carrying on could silently cut bytes out of a connection or lose its
// DIAL_RSP, credit or close. (Packets that decode but are bad, of an
// unknown type or for an unknown connection, are dropped or answered one
// at a time; only this ends every connection of the stream.)
var ErrUndecodable = errors.New("undecodable packet")

// zeroCopyMin is the smallest payload kept in the receive buffers; smaller
// ones are copied, so that a queued payload never pins more than about
// twice its size (HTTP/2 frames are read into buffers of up to 16 KiB).
const zeroCopyMin = 16 << 10

// fastPathMin is the smallest message the fast path looks at; below it the
// copy costs nothing worth avoiding.
const fastPathMin = 4 << 10

// prefixLen bounds the bytes before a DATA payload (tags, lengths, IDs and
// Moat's fields) and after it (Moat's fields).
const prefixLen = 64

// Unmarshal decodes data into f. The caller keeps its reference to data;
// f.Payload holds references of its own.
func (f *Frame) Unmarshal(data mem.BufferSlice, pool mem.BufferPool) error {
	*f = Frame{}
	if data.Len() >= fastPathMin && f.fastData(data, pool) {
		return nil
	}
	buf := data.MaterializeToBuffer(pool)
	defer buf.Free()
	p := new(client.Packet)
	if err := proto.Unmarshal(buf.ReadOnlyData(), p); err != nil {
		return err
	}
	f.Packet = p
	return nil
}

// fastData takes a DATA packet whose fields are, in any order, type (1),
// Moat's origin and credit (9, 10) and data (4), and whose Data message is
// connectID (1) then data (3): what Moat and upstream encoders write. It
// reports false, having taken nothing, for any other shape.
func (f *Frame) fastData(data mem.BufferSlice, pool mem.BufferPool) bool {
	total := data.Len()
	var pre [prefixLen]byte
	n := copyRange(data, 0, pre[:])
	b := pre[:n]
	off := 0
	typ := uint64(0)
	var ext Ext
	payloadOff, payloadLen, dataEnd := -1, 0, -1
	var connID int64
	for payloadOff < 0 {
		num, wt, l := protowire.ConsumeTag(b[off:])
		if l < 0 {
			return false
		}
		off += l
		switch {
		case num == 1 && wt == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b[off:])
			if l < 0 {
				return false
			}
			typ, off = v, off+l
		case (num == FieldOrigin || num == FieldCredit) && wt == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b[off:])
			if l < 0 || !ext.set(num, v) {
				return false
			}
			off += l
		case num == 4 && wt == protowire.BytesType:
			dl, l := protowire.ConsumeVarint(b[off:])
			if l < 0 || dl > uint64(total) {
				return false
			}
			off += l
			dataEnd = off + int(dl)
			// Data: connectID (1), then data (3) running to the end of the message.
			num, wt, l := protowire.ConsumeTag(b[off:])
			if l < 0 || num != 1 || wt != protowire.VarintType {
				return false
			}
			off += l
			id, l := protowire.ConsumeVarint(b[off:])
			if l < 0 {
				return false
			}
			off += l
			connID = int64(id)
			num, wt, l = protowire.ConsumeTag(b[off:])
			if l < 0 || num != 3 || wt != protowire.BytesType {
				return false
			}
			off += l
			pl, l := protowire.ConsumeVarint(b[off:])
			if l < 0 || uint64(off+l)+pl != uint64(dataEnd) {
				return false
			}
			payloadOff, payloadLen = off+l, int(pl)
		default:
			return false
		}
	}
	if typ != uint64(client.PacketType_DATA) || connID == 0 || dataEnd > total || total-dataEnd > prefixLen {
		return false
	}
	// Only Moat's fields may follow the Data message.
	var post [prefixLen]byte
	tail := post[:copyRange(data, dataEnd, post[:total-dataEnd])]
	for len(tail) > 0 {
		num, wt, l := protowire.ConsumeTag(tail)
		if l < 0 || (num != FieldOrigin && num != FieldCredit) || wt != protowire.VarintType {
			return false
		}
		v, m := protowire.ConsumeVarint(tail[l:])
		if m < 0 || !ext.set(num, v) {
			return false
		}
		tail = tail[l+m:]
	}
	f.ConnectID, f.Ext = connID, ext
	if payloadLen < zeroCopyMin {
		buf := pool.Get(payloadLen)
		copyRange(data, payloadOff, *buf)
		f.Payload = mem.BufferSlice{mem.NewBuffer(buf, pool)}
	} else {
		f.Payload = sliceRange(data, payloadOff, payloadLen)
	}
	return true
}

// set records Moat's field num; false for a value no Moat peer sends.
func (e *Ext) set(num protowire.Number, v uint64) bool {
	if num == FieldOrigin {
		if v > uint64(OriginNode) {
			return false
		}
		e.Origin = Origin(v)
		return true
	}
	e.Credit = v
	return true
}

// copyRange copies data[off:off+len(dst)] (or less at the end) into dst.
func copyRange(data mem.BufferSlice, off int, dst []byte) int {
	n := 0
	for _, b := range data {
		d := b.ReadOnlyData()
		if off >= len(d) {
			off -= len(d)
			continue
		}
		n += copy(dst[n:], d[off:])
		off = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// sliceRange returns data[off:off+n] as new references to data's buffers.
func sliceRange(data mem.BufferSlice, off, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for _, b := range data {
		l := b.Len()
		if off >= l {
			off -= l
			continue
		}
		end := min(l, off+n)
		out = append(out, b.Slice(off, end))
		n -= end - off
		off = 0
		if n == 0 {
			break
		}
	}
	return out
}

// OutData is a DATA packet to send whose payload goes to the transport
// without a copy. Marshal takes over the reference to Payload: the
// transport frees it once written.
type OutData struct {
	Origin    Origin
	ConnectID int64
	Payload   mem.BufferSlice
}

// Marshal encodes d as upstream's Packet{type: DATA, data: {connectID,
// data}}, with Moat's origin field before the Data message for
// node-originated connections (protobuf fields may come in any order).
func (d *OutData) Marshal() mem.BufferSlice {
	pl := d.Payload.Len()
	inner := protowire.SizeTag(1) + protowire.SizeVarint(uint64(d.ConnectID)) +
		protowire.SizeTag(3) + protowire.SizeBytes(pl)
	hdr := make([]byte, 0, 40)
	hdr = protowire.AppendTag(hdr, 1, protowire.VarintType)
	hdr = protowire.AppendVarint(hdr, uint64(client.PacketType_DATA))
	if d.Origin != OriginControlPlane {
		hdr = protowire.AppendTag(hdr, FieldOrigin, protowire.VarintType)
		hdr = protowire.AppendVarint(hdr, uint64(d.Origin))
	}
	hdr = protowire.AppendTag(hdr, 4, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(inner))
	hdr = protowire.AppendTag(hdr, 1, protowire.VarintType)
	hdr = protowire.AppendVarint(hdr, uint64(d.ConnectID))
	hdr = protowire.AppendTag(hdr, 3, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(pl))
	out := make(mem.BufferSlice, 0, 1+len(d.Payload))
	out = append(out, mem.SliceBuffer(hdr))
	out = append(out, d.Payload...)
	d.Payload = nil
	return out
}
