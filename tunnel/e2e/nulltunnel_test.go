package e2e

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The null tunnel is the floor under a fresh tunnel: two helper processes
// (this test binary, re-executed) that pass the same messages between the
// same processes as a fresh konnectivity tunnel, in the same order, and do
// nothing else - no HTTP/2, no protobuf, no TLS, one goroutine per
// connection. The client connects to the server's Unix socket and waits for
// its greeting (grpc-go's client waits for the server's SETTINGS), sends the
// address (the Proxy stream's HEADERS and DIAL_REQ), the server asks the
// agent over one long-lived TCP connection, the agent dials and answers, the
// server tells the client (DIAL_RSP); then bytes flow client -> server ->
// agent -> destination and back, and the destination's close comes back
// the same way. Twelve messages cross a process boundary before the client
// has its answer, as in the real tunnel.
//
// Between server and agent each message is op (1 byte), connection (4),
// length (4), payload.
const (
	nullDial  = 'D' // server -> agent: payload is the address
	nullDone  = 'O' // agent -> server: dialled (payload empty) or the error
	nullData  = 'W' // either way
	nullClose = 'C' // either way
)

// nullLink is one side of the server-agent connection; writes are whole
// messages under a lock.
type nullLink struct {
	mu sync.Mutex
	c  net.Conn
	r  *bufio.Reader
}

func (l *nullLink) send(op byte, id uint32, p []byte) error {
	var h [9]byte
	h[0] = op
	binary.BigEndian.PutUint32(h[1:5], id)
	binary.BigEndian.PutUint32(h[5:9], uint32(len(p)))
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := (&net.Buffers{h[:], p}).WriteTo(l.c)
	return err
}

func (l *nullLink) recv() (op byte, id uint32, p []byte, err error) {
	var h [9]byte
	if _, err = io.ReadFull(l.r, h[:]); err != nil {
		return
	}
	p = make([]byte, binary.BigEndian.Uint32(h[5:9]))
	_, err = io.ReadFull(l.r, p)
	return h[0], binary.BigEndian.Uint32(h[1:5]), p, err
}

// nullConns maps connection numbers to local sockets.
type nullConns struct {
	mu sync.Mutex
	m  map[uint32]net.Conn
}

func (cs *nullConns) get(id uint32) net.Conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.m[id]
}

func (cs *nullConns) put(id uint32, c net.Conn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c == nil {
		delete(cs.m, id)
	} else {
		cs.m[id] = c
	}
}

// pump sends what c reads as DATA for id, then CLOSE.
func (cs *nullConns) pump(l *nullLink, id uint32, c io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 && l.send(nullData, id, buf[:n]) != nil {
			return
		}
		if err != nil {
			l.send(nullClose, id, nil)
			return
		}
	}
}

// deliver handles DATA and CLOSE from the link.
func (cs *nullConns) deliver(op byte, id uint32, p []byte) {
	c := cs.get(id)
	if c == nil {
		return
	}
	switch op {
	case nullData:
		c.Write(p)
	case nullClose:
		cs.put(id, nil)
		c.Close()
	}
}

// nullServerHelper serves the null tunnel's clients on a Unix socket and
// its agent on a TCP port; it writes "<socket> <port>\n" to file.
func nullServerHelper(file string) {
	uds := filepath.Join(filepath.Dir(file), "null.sock")
	front, err := net.Listen("unix", uds)
	if err != nil {
		os.Exit(1)
	}
	back, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	if err := os.WriteFile(file, []byte(uds+" "+back.Addr().String()+"\n"), 0o600); err != nil {
		os.Exit(1)
	}
	ac, err := back.Accept()
	if err != nil {
		os.Exit(1)
	}
	link := &nullLink{c: ac, r: bufio.NewReader(ac)}
	conns := &nullConns{m: map[uint32]net.Conn{}}
	go func() {
		for {
			op, id, p, err := link.recv()
			if err != nil {
				os.Exit(0)
			}
			if op == nullDone {
				c := conns.get(id)
				if c == nil {
					continue
				}
				if len(p) > 0 { // the agent's dial failed
					conns.put(id, nil)
					c.Close()
					continue
				}
				c.Write([]byte{nullDone})
				go conns.pump(link, id, c)
				continue
			}
			conns.deliver(op, id, p)
		}
	}()
	var next uint32
	for {
		c, err := front.Accept()
		if err != nil {
			os.Exit(0)
		}
		next++
		id := next
		go func() {
			c.Write([]byte{'S'}) // the greeting the client waits for
			// The address, byte by byte: the client sends nothing more
			// before the answer, and nothing may stay in a buffer.
			var addr []byte
			one := make([]byte, 1)
			for {
				if _, err := io.ReadFull(c, one); err != nil {
					c.Close()
					return
				}
				if one[0] == '\n' {
					break
				}
				addr = append(addr, one[0])
			}
			conns.put(id, c)
			link.send(nullDial, id, addr)
		}()
	}
}

// nullAgentHelper connects to the null server at addr and dials for it.
func nullAgentHelper(addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		os.Exit(1)
	}
	link := &nullLink{c: c, r: bufio.NewReader(c)}
	conns := &nullConns{m: map[uint32]net.Conn{}}
	for {
		op, id, p, err := link.recv()
		if err != nil {
			os.Exit(0)
		}
		if op != nullDial {
			conns.deliver(op, id, p)
			continue
		}
		go func() {
			bc, err := net.Dial("tcp", string(p))
			if err != nil {
				link.send(nullDone, id, []byte(err.Error()))
				return
			}
			conns.put(id, bc)
			link.send(nullDone, id, nil)
			conns.pump(link, id, bc)
		}()
	}
}

// startNullTunnel runs the null tunnel's server and agent processes and
// returns the server's Unix socket and the two processes' IDs.
func startNullTunnel(b testing.TB) (string, []int) {
	dir := b.TempDir()
	file := filepath.Join(dir, "null-addr")
	var pids []int
	start := func(env string) {
		c := exec.Command(os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(), env)
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, c.Process.Pid)
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	start("MOAT_TUNNEL_NULL_SERVER=" + file)
	var fields []string
	eventually(b, "null tunnel server", func() bool {
		a, err := os.ReadFile(file)
		fields = strings.Fields(string(a))
		return err == nil && strings.HasSuffix(string(a), "\n") && len(fields) == 2
	})
	start("MOAT_TUNNEL_NULL_AGENT=" + fields[1])
	return fields[0], pids
}

// nullDialer dials address through the null tunnel at uds.
func nullDialer(uds, address string) dialFunc {
	return func() (net.Conn, error) {
		c, err := net.Dial("unix", uds)
		if err != nil {
			return nil, err
		}
		one := make([]byte, 1)
		if _, err := io.ReadFull(c, one); err != nil { // greeting
			c.Close()
			return nil, err
		}
		if _, err := io.WriteString(c, address+"\n"); err != nil {
			c.Close()
			return nil, err
		}
		if _, err := io.ReadFull(c, one); err != nil { // dialled
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// TestNullTunnel checks that the floor benchmark's null tunnel carries a
// request through its processes.
func TestNullTunnel(t *testing.T) {
	hs := httpBackend(t)
	uds, _ := startNullTunnel(t)
	for range 3 {
		c, err := nullDialer(uds, hs.Listener.Addr().String())()
		if err != nil {
			t.Fatal(err)
		}
		if err := smallGet(c); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}
