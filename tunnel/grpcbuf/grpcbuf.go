// Package grpcbuf is a gRPC buffer pool sized for tunnel traffic. grpc-go's
// default pool has no tier between 32 KiB and 1 MiB and zeroes the whole
// buffer on every Get, so each ~128 KiB DATA frame cost a 1 MiB memclr (a
// fifth of the tunnel's CPU in profiles). gRPC fills exactly the requested
// length of every buffer it gets, so stale bytes are never exposed and
// zeroing is unnecessary. The package also bounds what an agent-hop
// socket keeps unsent in the kernel (unsent.go).
package grpcbuf

import "sync"

var sizes = []int{256, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 160 << 10, 256 << 10, 1 << 20, 4 << 20}

// Pool implements google.golang.org/grpc/mem.BufferPool.
type Pool struct{ tiers []sync.Pool }

// New returns a pool with tiers from 256 B to 4 MiB (the largest frame).
func New() *Pool { return &Pool{tiers: make([]sync.Pool, len(sizes))} }

func tier(n int) int {
	for i, s := range sizes {
		if n <= s {
			return i
		}
	}
	return -1
}

// Get returns a buffer of length n; its contents are unspecified.
func (p *Pool) Get(n int) *[]byte {
	i := tier(n)
	if i < 0 {
		b := make([]byte, n)
		return &b
	}
	if bp, ok := p.tiers[i].Get().(*[]byte); ok {
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n, sizes[i])
	return &b
}

// Put returns a buffer obtained from Get (or a prefix of it).
func (p *Pool) Put(bp *[]byte) {
	c := cap(*bp)
	i := tier(c)
	if i < 0 || sizes[i] != c {
		return // not one of ours: let the GC have it
	}
	*bp = (*bp)[:c]
	p.tiers[i].Put(bp)
}
