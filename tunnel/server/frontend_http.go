package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/moat-net/moat/tunnel/mux"
)

// HTTPConnect returns the HTTP CONNECT frontend. The 200 is written only
// after the agent's DIAL_RSP; failures map to upstream's status codes.
func (s *Server) HTTPConnect() http.Handler {
	return http.HandlerFunc(s.serveConnect)
}

func (s *Server) serveConnect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.Header().Set("Allow", http.MethodConnect)
		http.Error(w, "only CONNECT is supported", http.StatusMethodNotAllowed)
		return
	}
	// Checked before dialing: an agent must not dial for a request whose
	// connection cannot be handed over (HTTP/2).
	hj, ok := w.(http.Hijacker)
	if !ok || r.ProtoMajor != 1 {
		http.Error(w, "CONNECT needs HTTP/1.1: the connection cannot be hijacked", http.StatusHTTPVersionNotSupported)
		return
	}
	conn, err := s.dial(r.Context(), r.Host)
	if err != nil {
		s.log.V(2).Info("CONNECT failed", "address", r.Host, "err", err)
		http.Error(w, err.Error(), connectStatus(err))
		return
	}
	nc, rw, err := hj.Hijack()
	if err != nil {
		conn.Close()
		return
	}
	if _, err := io.WriteString(nc, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		conn.Close()
		nc.Close()
		return
	}
	mux.PipeReader(bufferedReader(rw.Reader, nc), nc, conn)
}

func bufferedReader(br *bufio.Reader, nc net.Conn) io.Reader {
	if br.Buffered() == 0 {
		return nc
	}
	b, _ := br.Peek(br.Buffered())
	return io.MultiReader(strings.NewReader(string(b)), nc)
}

// connectStatus maps a dial error to upstream's HTTP CONNECT status.
func connectStatus(err error) int {
	msg := err.Error()
	switch {
	case errors.Is(err, errNoAgent):
		return http.StatusInternalServerError
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(msg, "timeout"), strings.Contains(msg, "timed out"):
		return http.StatusGatewayTimeout
	case strings.Contains(msg, "too many open files"):
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadGateway
	}
}
