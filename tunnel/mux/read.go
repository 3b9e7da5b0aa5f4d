package mux

import (
	"errors"
	"io"
	"sync"
	"syscall"
)

var chunkPools sync.Map // size -> *sync.Pool

func pool(size int) *sync.Pool {
	if p, ok := chunkPools.Load(size); ok {
		return p.(*sync.Pool)
	}
	p, _ := chunkPools.LoadOrStore(size, &sync.Pool{New: func() any { b := make([]byte, size); return &b }})
	return p.(*sync.Pool)
}

// smallRead bounds the buffer held by a reader that cannot wait for
// readability without one (TLS, buffered readers): one TLS record.
const smallRead = 16 << 10

// readChunks reads r and hands each chunk to send; the buffer is reused after
// send returns, which is safe because a gRPC Send marshals before returning.
// For sockets it waits for readability without holding a buffer, so an idle
// connection costs no buffer memory.
func readChunks(r io.Reader, size int, send func([]byte) error) (int64, error) {
	if sc, ok := r.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			return readRaw(rc, size, send)
		}
	}
	size = min(size, smallRead)
	p := pool(size)
	bp := p.Get().(*[]byte)
	defer p.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			total += int64(n)
			if serr := send(buf[:n]); serr != nil {
				return total, serr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
	}
}

func readRaw(rc syscall.RawConn, size int, send func([]byte) error) (int64, error) {
	p := pool(size)
	var total int64
	for {
		var bp *[]byte
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			b := p.Get().(*[]byte)
			for {
				n, rerr = syscall.Read(int(fd), *b)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				p.Put(b)
				return false // wait for readability, holding nothing
			}
			bp = b
			return true
		})
		if err != nil {
			if bp != nil {
				p.Put(bp)
			}
			return total, err
		}
		if rerr != nil {
			p.Put(bp)
			return total, rerr
		}
		if n <= 0 {
			p.Put(bp)
			return total, nil // EOF
		}
		total += int64(n)
		serr := send((*bp)[:n])
		p.Put(bp)
		if serr != nil {
			return total, serr
		}
	}
}
