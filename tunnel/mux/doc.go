// Package mux carries many TCP connections over one konnectivity Packet
// stream (an agent tunnel) with per-connection flow control.
//
// The receive loop never blocks: DATA is appended to the connection's own
// bounded queue and a per-connection consumer drains it. With a Moat peer the
// sender holds per-connection credit (window) and stops reading its socket
// when the window is spent, so a stalled reader only stops its own
// connection. With a stock peer (no credit extension) a connection whose queue
// exceeds its bound is closed with an error instead of stalling the others.
//
// With a Moat peer that announced half-close, a local EOF is passed on as
// FIN and becomes a shutdown of the far socket's write side, so each
// direction of a connection ends on its own (Pipe); with a stock peer an
// EOF closes the connection, as upstream does.
//
// Writers waiting for the stream take it small packets first (sendLock), so
// a new connection's handshake waits behind the chunk being written, not
// behind a chunk of every busy connection.
package mux
