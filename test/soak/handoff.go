package soak

import (
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"path/filepath"
)

// Files change owners between workers: a worker closes a file, sends its
// name and model down the pipe to the next worker, which opens it and
// checks all of it against the model before using it (close-to-open
// consistency across processes).

// handoff passes a file and its model to the next worker.
type handoff struct {
	Name  string // base name, the same in every directory
	Model []byte
	From  int   // worker that closed it
	Op    int64 // its operation index
}

// receive decodes the handoffs that come through in into w.incoming
// until the sending worker closes its end; the error, nil at EOF, goes
// to w.inErr.
func (w *worker) receive(in io.Reader) {
	dec := gob.NewDecoder(in)
	for {
		var h handoff
		if err := dec.Decode(&h); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			close(w.incoming)
			w.inErr <- err
			return
		}
		w.incoming <- h
	}
}

// handOff closes f and passes it to the next worker.
func (w *worker) handOff(f *file) {
	errs := w.res.Errors
	w.do(kind{"handoff", 0, func(w *worker, f *file) error {
		w.desc = fmt.Sprintf("handoff %s size=%d to=w%d", f.name, len(f.model), (w.index+1)%w.cfg.Procs)
		if w.rng.IntN(2) == 0 {
			if err := f.f.Sync(); err != nil {
				return fmt.Errorf("fsync: %w", err)
			}
		}
		err := f.f.Close()
		f.f = nil
		if err != nil {
			return fmt.Errorf("close: %w", err)
		}
		return nil
	}}, f)
	if w.res.Errors != errs {
		return // the close failed: keep the file
	}
	for i, g := range w.files {
		if g == f {
			w.files = append(w.files[:i], w.files[i+1:]...)
			break
		}
	}
	if err := w.enc.Encode(handoff{Name: f.name, Model: f.model, From: w.index, Op: w.op}); err != nil {
		w.logf("handoff of %s: %v", f.name, err)
		w.res.Errors++
		return
	}
	w.res.Handoffs++
}

// takeIncoming adopts the files handed to this worker; with all, until the
// sender is done.
func (w *worker) takeIncoming(dir string, all bool) {
	for {
		if all {
			h, ok := <-w.incoming
			if !ok {
				return
			}
			w.adopt(dir, h)
			continue
		}
		select {
		case h, ok := <-w.incoming:
			if !ok {
				return
			}
			w.adopt(dir, h)
		default:
			return
		}
	}
}

// adopt opens a file handed over by another worker and checks all of it.
func (w *worker) adopt(dir string, h handoff) {
	f := &file{name: h.Name, path: filepath.Join(dir, h.Name), model: h.Model}
	w.files = append(w.files, f)
	w.do(kind{"adopt", 0, func(w *worker, f *file) error {
		w.desc = fmt.Sprintf("adopt %s size=%d from=w%d op=#%d", f.name, len(f.model), h.From, h.Op)
		return w.verifyContents(f)
	}}, f)
}
