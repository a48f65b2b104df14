package oncrpc

import (
	"sync"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

type xdrEncoder struct{ xdr.Encoder }

// buffer is a pooled receive buffer.
type buffer struct{ buf []byte }

var bufferPool = sync.Pool{New: func() any { return &buffer{buf: make([]byte, 0, 8<<10)} }}

// maxPooled keeps very large buffers (1 MiB READ replies are pooled, a
// 64 MiB oddity is not) from pinning memory in the pool.
const maxPooled = 2<<20 + 64<<10

func getBuffer(n int) *buffer {
	b := bufferPool.Get().(*buffer)
	b.buf = b.buf[:0]
	b.grow(n)
	return b
}

func putBuffer(b *buffer) {
	if cap(b.buf) <= maxPooled {
		bufferPool.Put(b)
	}
}

// grow extends b.buf by n bytes, keeping its contents.
func (b *buffer) grow(n int) {
	l := len(b.buf)
	if cap(b.buf)-l < n {
		nb := make([]byte, l, max(2*cap(b.buf), l+n))
		copy(nb, b.buf)
		b.buf = nb
	}
	b.buf = b.buf[:l+n]
}
