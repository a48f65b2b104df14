package mrcache

import (
	"context"
	"errors"
	"fmt"
)

// Poison writes marker, repeated, over every byte of the pool's budget
// that is free, mapping all of it first: the poisoning of Linux's slab
// debugging. A test that then finds the marker in what a call delivered
// has found bytes nobody wrote for that call.
func (p *Pool) Poison(marker []byte) error {
	if len(marker) == 0 {
		return errors.New("mrcache: empty poison marker")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel() // GetWait takes what is free and never waits
	var got []*Buffer
	for size := ChunkSize; size >= MinBlock; size /= 2 {
		for {
			b, err := p.Get(size)
			if errors.Is(err, ErrNoMemory) {
				b, err = p.GetWait(done, size)
			}
			if err != nil {
				break
			}
			got = append(got, b)
		}
	}
	if len(got) == 0 {
		return errors.New("mrcache: no free memory to poison")
	}
	var first error
	for _, b := range got {
		mem := b.Bytes()
		for i := range mem {
			mem[i] = marker[i%len(marker)]
		}
		if err := p.Put(b); err != nil && first == nil {
			first = fmt.Errorf("mrcache: poison: %w", err)
		}
	}
	return first
}
