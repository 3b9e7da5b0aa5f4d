package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// countingProxy forwards TCP connections to an address and counts the
// bytes that come back: what the API server sends the agent (TLS records,
// so a few percent above the payload).
type countingProxy struct {
	ln     net.Listener
	target string
	in     atomic.Int64
	wg     sync.WaitGroup
}

func newCountingProxy(target string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

// received is the number of bytes sent from the target to clients so far.
func (p *countingProxy) received() int64 { return p.in.Load() }

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *countingProxy) forward(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, c)
		_ = s.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(countingWriter{c, &p.in}, s)
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.n.Add(int64(n))
	return n, err
}

func (p *countingProxy) close() {
	p.ln.Close()
	p.wg.Wait()
}
