package fuse_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/trace"
)

// TestConcurrentIO writes several files at once in odd-sized pieces
// while other goroutines stat and read them, then checks every byte.
// Run with -race it also checks the write buffers' locking.
func TestConcurrentIO(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		var opts fuse.Options
		if os.Getenv("RDMAFS_TEST_TRACE") != "" {
			opts.Tracer = trace.New(os.Stderr, trace.All)
		}
		mnt, m := mountPeer(t, p, opts)
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		const files, size = 6, 3 << 20
		want := make([][]byte, files)
		var wg sync.WaitGroup
		errs := make(chan error, 3*files)
		for i := range files {
			want[i] = make([]byte, size)
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for j := range want[i] {
				want[i][j] = byte(r.Uint32())
			}
			name := filepath.Join(d, fmt.Sprintf("f%d", i))
			wg.Add(2)
			go func() {
				defer wg.Done()
				f, err := os.Create(name)
				if err != nil {
					errs <- err
					return
				}
				for off := 0; off < size; {
					n := min(size-off, 1+rand.IntN(300<<10))
					if _, err := f.WriteAt(want[i][off:off+n], int64(off)); err != nil {
						errs <- err
						break
					}
					off += n
				}
				if err := f.Close(); err != nil {
					errs <- fmt.Errorf("close %s: %w", name, err)
				}
			}()
			go func() {
				defer wg.Done()
				for range 20 {
					if _, err := os.Stat(name); err != nil && !os.IsNotExist(err) {
						errs <- err
						return
					}
					if b, err := os.ReadFile(name); err == nil && !bytes.Equal(b, want[i][:len(b)]) {
						errs <- fmt.Errorf("%s: concurrent read of %d bytes differs", name, len(b))
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for i := range files {
			b, err := os.ReadFile(filepath.Join(d, fmt.Sprintf("f%d", i)))
			if err != nil || !bytes.Equal(b, want[i]) {
				t.Errorf("%s: f%d: %d bytes, %v; content equal: %v", p.name, i, len(b), err, bytes.Equal(b, want[i]))
			}
		}
		t.Logf("%s: rsize=%d wsize=%d writes=%d reads=%d", p.name, m.FS.Client().RSize(), m.FS.Client().WSize(),
			m.FS.Stats.Writes.Load(), m.FS.Stats.Reads.Load())
	})
}
