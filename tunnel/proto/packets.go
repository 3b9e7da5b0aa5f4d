package proto

import "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

// The constructors below build upstream packets and attach Moat's origin
// marker when the connection is node-originated.

// DialReq builds a DIAL_REQ for a TCP connection to address.
func DialReq(o Origin, address string, random int64) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{
		DialRequest: &client.DialRequest{Protocol: "tcp", Address: address, Random: random}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// DialRsp builds a DIAL_RSP; errMsg empty means success.
func DialRsp(o Origin, random, connID int64, errMsg string) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: random, ConnectID: connID, Error: errMsg}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// DialCls builds a DIAL_CLS for the pending dial random.
func DialCls(o Origin, random int64) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DIAL_CLS, Payload: &client.Packet_CloseDial{
		CloseDial: &client.CloseDial{Random: random}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// Data builds a DATA packet carrying b.
func Data(o Origin, connID int64, b []byte) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
		Data: &client.Data{ConnectID: connID, Data: b}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// Credit builds Moat's window update: an empty DATA packet with field 10.
// It is only sent to peers that announced the extension.
func Credit(o Origin, connID int64, n uint64) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
		Data: &client.Data{ConnectID: connID}}}
	SetExt(p, Ext{Origin: o, Credit: n})
	return p
}

// Fin builds Moat's half-close: an empty DATA packet with field 11, the
// sender's last on connID. It is only sent to peers that announced the
// extension.
func Fin(o Origin, connID int64) *client.Packet {
	p := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
		Data: &client.Data{ConnectID: connID}}}
	SetExt(p, Ext{Origin: o, Fin: true})
	return p
}

// CloseReq builds a CLOSE_REQ.
func CloseReq(o Origin, connID int64) *client.Packet {
	p := &client.Packet{Type: client.PacketType_CLOSE_REQ, Payload: &client.Packet_CloseRequest{
		CloseRequest: &client.CloseRequest{ConnectID: connID}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// CloseRsp builds a CLOSE_RSP.
func CloseRsp(o Origin, connID int64, errMsg string) *client.Packet {
	p := &client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{
		CloseResponse: &client.CloseResponse{ConnectID: connID, Error: errMsg}}}
	SetExt(p, Ext{Origin: o})
	return p
}

// Drain builds the DRAIN hint an agent sends before it terminates.
func Drain() *client.Packet {
	return &client.Packet{Type: client.PacketType_DRAIN, Payload: &client.Packet_Drain{Drain: &client.Drain{}}}
}
