package mux

import (
	"errors"
	"io"
	"syscall"

	"google.golang.org/grpc/mem"
)

// smallRead bounds the buffer held by a reader that cannot wait for
// readability without one (TLS, buffered readers): one TLS record.
const smallRead = 16 << 10

// readChunks reads r into buffers from pool and hands each one over to
// send, which owns it from then on (the transport frees it once written).
// For sockets it waits for readability without holding a buffer, so an idle
// connection costs no buffer memory.
func readChunks(r io.Reader, size int, pool mem.BufferPool, send func(mem.Buffer) error) (int64, error) {
	if sc, ok := r.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			return readRaw(rc, size, pool, send)
		}
	}
	size = min(size, smallRead)
	var total int64
	for {
		bp := pool.Get(size)
		n, err := r.Read(*bp)
		if n > 0 {
			total += int64(n)
			*bp = (*bp)[:n]
			if serr := send(mem.NewBuffer(bp, pool)); serr != nil {
				return total, serr
			}
		} else {
			pool.Put(bp)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
	}
}

func readRaw(rc syscall.RawConn, size int, pool mem.BufferPool, send func(mem.Buffer) error) (int64, error) {
	var total int64
	for {
		var bp *[]byte
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			b := pool.Get(size)
			for {
				n, rerr = syscall.Read(int(fd), *b)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				pool.Put(b)
				return false // wait for readability, holding nothing
			}
			bp = b
			return true
		})
		if err != nil {
			if bp != nil {
				pool.Put(bp)
			}
			return total, err
		}
		if rerr != nil {
			pool.Put(bp)
			return total, rerr
		}
		if n <= 0 {
			pool.Put(bp)
			return total, nil // EOF
		}
		total += int64(n)
		*bp = (*bp)[:n]
		if serr := send(mem.NewBuffer(bp, pool)); serr != nil {
			return total, serr
		}
	}
}
