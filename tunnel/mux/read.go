package mux

import (
	"errors"
	"io"
	"sync"
)

var chunkPools sync.Map // size -> *sync.Pool

func pool(size int) *sync.Pool {
	if p, ok := chunkPools.Load(size); ok {
		return p.(*sync.Pool)
	}
	p, _ := chunkPools.LoadOrStore(size, &sync.Pool{New: func() any { b := make([]byte, size); return &b }})
	return p.(*sync.Pool)
}

// readChunks reads r into pooled buffers of size bytes and hands each chunk
// to send. The buffer is reused after send returns, which is safe because a
// gRPC Send marshals the message before it returns.
func readChunks(r io.Reader, size int, send func([]byte) error) (int64, error) {
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
