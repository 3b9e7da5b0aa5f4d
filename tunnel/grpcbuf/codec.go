package grpcbuf

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	tproto "github.com/moat-net/moat/tunnel/proto"
)

// Codec is the "proto" codec with its buffers taken from a Pool: grpc-go's
// default codec marshals and gathers messages in the default (zeroing) pool
// whatever pool the transport uses. Install it per server or per call
// (grpc.ForceServerCodecV2, grpc.ForceCodecV2), never globally.
type Codec struct{ Pool *Pool }

// Name is the content subtype, the same as grpc-go's proto codec.
func (Codec) Name() string { return "proto" }

// Marshal encodes v into one pooled buffer; a *proto.OutData keeps its
// payload buffers (no copy).
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if d, ok := v.(*tproto.OutData); ok {
		return d.Marshal(), nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("grpcbuf: marshal %T: not a proto.Message", v)
	}
	size := proto.Size(m)
	buf := c.Pool.Get(size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		c.Pool.Put(buf)
		return nil, fmt.Errorf("grpcbuf: marshal: %w", err)
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, c.Pool)}, nil
}

// Unmarshal decodes data into v; proto.Unmarshal copies what it keeps, so
// the buffers can be released afterwards. A *proto.Frame keeps a large DATA
// payload in the receive buffers, with references of its own, and a
// message that does not decode leaves only its Err.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*tproto.Frame); ok {
		// A message that is not a Packet is the receiver's to judge (see
		// proto.ErrUndecodable): gRPC would end the stream with a generic
		// Internal error that tells the peer nothing.
		if err := f.Unmarshal(data, c.Pool); err != nil {
			*f = tproto.Frame{Err: fmt.Errorf("%w (%d bytes): %v", tproto.ErrUndecodable, data.Len(), err)}
		}
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpcbuf: unmarshal %T: not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.Pool)
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		return fmt.Errorf("grpcbuf: unmarshal: %w", err)
	}
	return nil
}
