package proto

import (
	"fmt"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Check reports whether p is well formed: a known type whose payload is
// present and of the matching kind, and non-zero IDs where the protocol
// requires them. Receivers call it before acting on a packet so that a
// malformed packet is counted and dropped instead of acted upon.
func Check(p *client.Packet) error {
	if p == nil {
		return fmt.Errorf("nil packet")
	}
	switch p.Type {
	case client.PacketType_DIAL_REQ:
		r := p.GetDialRequest()
		if r == nil {
			return fmt.Errorf("DIAL_REQ without dialRequest payload")
		}
		if r.Protocol != "tcp" {
			return fmt.Errorf("DIAL_REQ protocol %q: only tcp is supported", r.Protocol)
		}
		if r.Address == "" {
			return fmt.Errorf("DIAL_REQ without address")
		}
	case client.PacketType_DIAL_RSP:
		if p.GetDialResponse() == nil {
			return fmt.Errorf("DIAL_RSP without dialResponse payload")
		}
	case client.PacketType_CLOSE_REQ:
		r := p.GetCloseRequest()
		if r == nil {
			return fmt.Errorf("CLOSE_REQ without closeRequest payload")
		}
		if r.ConnectID == 0 {
			return fmt.Errorf("CLOSE_REQ with connectID 0")
		}
	case client.PacketType_CLOSE_RSP:
		r := p.GetCloseResponse()
		if r == nil {
			return fmt.Errorf("CLOSE_RSP without closeResponse payload")
		}
		if r.ConnectID == 0 {
			return fmt.Errorf("CLOSE_RSP with connectID 0")
		}
	case client.PacketType_DATA:
		d := p.GetData()
		if d == nil {
			return fmt.Errorf("DATA without data payload")
		}
		if d.ConnectID == 0 {
			return fmt.Errorf("DATA with connectID 0")
		}
	case client.PacketType_DIAL_CLS:
		if p.GetCloseDial() == nil {
			return fmt.Errorf("DIAL_CLS without closeDial payload")
		}
	case client.PacketType_DRAIN:
		// Upstream agents may send DRAIN with or without the empty payload.
	default:
		return fmt.Errorf("unknown packet type %d", int32(p.Type))
	}
	return nil
}

// Reason is a short, bounded label for a Check failure, for metrics.
func Reason(p *client.Packet) string {
	if p == nil {
		return "nil"
	}
	if _, ok := client.PacketType_name[int32(p.Type)]; !ok {
		return "unknown_type"
	}
	return "malformed_" + p.Type.String()
}
