package decode

import (
	"fmt"
	"runtime"
)

// A large List (a cluster dump) is decoded on every core: this goroutine
// splits the items off the stream (a syntax-checked skip that copies their
// bytes into batches) while workers decode the batches, and the objects
// come out in document order. In-flight batches are bounded, so memory
// still holds the decoded objects and a few batches, not the input.

const batchBytes = 512 << 10

type batch struct {
	seq   int
	first int     // index of the first item in the list
	data  []byte  // the items, back to back
	ends  []int   // where each item ends in data
	at    []int64 // where each item starts in the input, for messages
	objs  []*Object
	err   error
}

// parallelItems decodes the items of the array src is at (after its '[')
// calling emit for each object in document order. inherit is the header
// items inherit.
func (x *decoder) parallelItems(s *scanner, inherit header, emit func(*Object)) error {
	workers := min(runtime.GOMAXPROCS(0), 8)
	work := make(chan *batch, workers)
	done := make(chan *batch, 2*workers)
	// Batch buffers go round: at most 2*workers+1 exist.
	spare := make(chan []byte, 2*workers+1)
	prefix := append([]int(nil), x.items...)
	for range workers {
		w := newDecoder()
		w.doc = x.doc
		w.d.ns = x.d.ns
		go w.decodeBatches(work, done, spare, prefix, inherit)
	}
	var (
		next     int // the next batch to emit
		inFlight int
		results  = map[int]*batch{}
		firstErr error
	)
	collect := func(b *batch) {
		inFlight--
		results[b.seq] = b
		for {
			r, ok := results[next]
			if !ok {
				return
			}
			delete(results, next)
			next++
			if firstErr != nil {
				continue
			}
			if r.err != nil {
				firstErr = r.err
				continue
			}
			for _, o := range r.objs {
				emit(o)
			}
		}
	}
	send := func(b *batch) {
		for inFlight >= 2*workers {
			collect(<-done)
		}
		inFlight++
		work <- b
	}
	newBatch := func(first int) *batch {
		select {
		case buf := <-spare:
			return &batch{first: first, data: buf[:0]}
		default:
			return &batch{first: first, data: make([]byte, 0, 2*batchBytes)}
		}
	}
	cur := newBatch(0)
	seq, i := 0, 0
	var splitErr error
	for {
		ok, err := s.elem()
		if err != nil {
			splitErr = err
			break
		}
		if !ok {
			break
		}
		if _, err := s.need(); err != nil {
			splitErr = err
			break
		}
		if s.buf[s.pos] != '{' {
			k, _ := s.peek()
			splitErr = fmt.Errorf("items[%d]: %w", i, errNotObject{k})
			break
		}
		cur.at = append(cur.at, s.consumed+int64(s.pos))
		if err := s.splitObject(&cur.data); err != nil {
			splitErr = fmt.Errorf("items[%d]: %w", i, err) // as when decoded in order
			break
		}
		cur.ends = append(cur.ends, len(cur.data))
		i++
		if len(cur.data) >= batchBytes {
			cur.seq, seq = seq, seq+1
			send(cur)
			cur = newBatch(i)
		}
	}
	if len(cur.ends) > 0 {
		cur.seq = seq
		send(cur)
	}
	close(work)
	for inFlight > 0 {
		collect(<-done)
	}
	if firstErr != nil {
		return firstErr
	}
	return splitErr
}

// decodeBatches is a worker: it decodes each batch's items as value would.
func (w *decoder) decodeBatches(work <-chan *batch, done chan<- *batch, spare chan<- []byte, prefix []int, inherit header) {
	s := &scanner{eof: true}
	for b := range work {
		start := 0
		b.objs = make([]*Object, 0, len(b.ends))
		emit := func(o *Object) { b.objs = append(b.objs, o) }
		for k, end := range b.ends {
			idx := b.first + k
			w.items = append(append(w.items[:0], prefix...), idx)
			s.buf, s.pos, s.end, s.consumed = b.data[start:end], 0, end-start, b.at[k]
			s.stack, s.first = s.stack[:0], s.first[:0]
			if err := w.value(s, inherit, emit); err != nil {
				b.err = fmt.Errorf("items[%d]: %w", idx, err)
				break
			}
			start = end
		}
		select {
		case spare <- b.data:
		default:
		}
		b.data, b.ends, b.at = nil, nil, nil
		done <- b
	}
}
