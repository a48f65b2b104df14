package iwarp

// ring is a growable FIFO that reuses its storage.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		bigger := make([]T, max(16, 2*len(r.buf)))
		k := copy(bigger, r.buf[r.head:])
		copy(bigger[k:], r.buf[:r.head])
		r.buf, r.head = bigger, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

// at returns a pointer to the i-th element from the head.
func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)%len(r.buf)] }

func (r *ring[T]) pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v
}
