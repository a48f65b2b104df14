package soak

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// file is one file a worker owns.
type file struct {
	name  string
	path  string
	f     *os.File // nil: closed (after an error), reopened by the next op
	model []byte
}

// kind is an operation kind with its weight in the random mix.
type kind struct {
	name   string
	weight int
	run    func(w *worker, f *file) error
}

var kinds = []kind{
	{"write", 24, (*worker).write},
	{"read", 24, (*worker).read},
	{"mapread", 10, (*worker).mapRead},
	{"mapwrite", 10, (*worker).mapWrite},
	{"truncate", 8, (*worker).truncate},
	{"fsync", 3, (*worker).fsync},
	{"reopen", 6, (*worker).reopen},
	{"verify", 2, (*worker).verifyAll},
	{"handoff", 4, nil}, // handled by the loop: it changes ownership
}

// maxReports caps the detailed mismatch reports per worker.
const maxReports = 10

// historyLen is how many past operations a mismatch report can show.
const historyLen = 512

type worker struct {
	cfg   Config
	index int
	rng   *rand.Rand
	data  *rand.ChaCha8
	files []*file
	res   Result

	op      int64  // index of the current operation
	desc    string // its description
	opStart atomic.Int64
	opDesc  atomic.Pointer[string]

	history [historyLen]string
	oplog   io.Writer
	out     io.Writer

	incoming chan handoff
	inErr    chan error
	enc      *gob.Encoder
	buf      []byte
}

// runWorker is the body of worker index: it runs until the deadline (or
// cfg.Ops), hands files over and takes them in through in and out, then
// checks every file it holds and removes them.
func runWorker(cfg Config, index int, in, out *os.File) (Result, error) {
	cfg.defaults()
	dir := cfg.Dirs[index%len(cfg.Dirs)]
	w := newWorker(cfg, index, out)
	if cfg.OpLog != "" {
		lf, err := os.Create(fmt.Sprintf("%s.w%d", cfg.OpLog, index))
		if err != nil {
			return w.res, err
		}
		defer lf.Close()
		bw := newLineBuffer(lf)
		defer bw.flush()
		w.oplog = bw
	}
	// Mismatched mmap accesses past the server's end of file raise
	// SIGBUS; with this they are panics the check recovers from.
	debug.SetPanicOnFault(true)
	go w.receive(in)
	stopWatch := w.watch()
	defer stopWatch()
	if err := w.createFiles(dir); err != nil {
		return w.res, err
	}
	w.run(dir)
	// No more handoffs from us; take in what the others still send.
	if err := out.Close(); err != nil {
		return w.res, err
	}
	w.takeIncoming(dir, true)
	if err := <-w.inErr; err != nil {
		return w.res, fmt.Errorf("handoff pipe: %w", err)
	}
	w.finish()
	return w.res, nil
}

// newWorker makes worker index, its random streams seeded from cfg.Seed
// and the index, handing files on through out.
func newWorker(cfg Config, index int, out *os.File) *worker {
	w := &worker{
		cfg:      cfg,
		index:    index,
		rng:      rand.New(rand.NewPCG(cfg.Seed, uint64(index))),
		res:      Result{Seed: cfg.Seed, Kinds: map[string]int64{}},
		out:      cfg.Out,
		incoming: make(chan handoff, 64),
		inErr:    make(chan error, 1),
		enc:      gob.NewEncoder(out),
		buf:      make([]byte, cfg.MaxLen+cfg.MaxOp),
	}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], cfg.Seed)
	binary.LittleEndian.PutUint64(seed[8:], uint64(index))
	w.data = rand.NewChaCha8(seed)
	return w
}

// createFiles creates the worker's own files in dir, empty.
func (w *worker) createFiles(dir string) error {
	for j := range w.cfg.Files {
		name := fmt.Sprintf("soak-%d-w%d-f%d", w.cfg.Seed, w.index, j)
		f := &file{name: name, path: filepath.Join(dir, name)}
		fd, err := os.OpenFile(f.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		f.f = fd
		w.files = append(w.files, f)
	}
	return nil
}

// run does random operations on the worker's files until the deadline
// or cfg.Ops, taking in the files handed to it as it goes.
func (w *worker) run(dir string) {
	cfg := w.cfg
	deadline := time.Now().Add(cfg.Duration)
	nextProgress := time.Now().Add(cfg.Progress)
	for time.Now().Before(deadline) && (cfg.Ops <= 0 || w.res.Ops < cfg.Ops) {
		if cfg.Progress > 0 && time.Now().After(nextProgress) {
			w.progress()
			nextProgress = time.Now().Add(cfg.Progress)
		}
		w.takeIncoming(dir, false)
		if len(w.files) == 0 {
			// Everything was handed on; wait for a file to come back.
			h, ok := <-w.incoming
			if !ok {
				return
			}
			w.adopt(dir, h)
			continue
		}
		f := w.files[w.rng.IntN(len(w.files))]
		switch k := w.pick(); {
		case k.name == "handoff":
			if cfg.Procs >= 2 && len(w.files) >= 2 {
				w.handOff(f)
			}
		case cfg.NoMmap && (k.name == "mapread" || k.name == "mapwrite"):
		default:
			w.do(k, f)
		}
	}
}

// pick draws an operation kind by the weights of kinds.
func (w *worker) pick() kind {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := w.rng.IntN(total)
	for _, k := range kinds {
		if n < k.weight {
			return k
		}
		n -= k.weight
	}
	return kinds[len(kinds)-1]
}

// finish checks every file the worker holds at the end, closes them,
// and removes them unless a mismatch was found.
func (w *worker) finish() {
	for _, f := range w.files {
		w.do(kind{"final-verify", 0, (*worker).finalVerify}, f)
	}
	for _, f := range w.files {
		if f.f != nil {
			f.f.Close()
		}
		if w.res.Mismatches == 0 {
			os.Remove(f.path)
		}
	}
	w.logf("done: %s", w.res)
}

// do runs one operation on f, timing it; an error resyncs f.
func (w *worker) do(k kind, f *file) {
	w.op++
	w.desc = fmt.Sprintf("%s %s size=%d", k.name, f.name, len(f.model))
	start := time.Now()
	w.opStart.Store(start.UnixNano())
	d := w.desc
	w.opDesc.Store(&d)
	var err error
	if f.f == nil {
		err = w.open(f)
	}
	if err == nil {
		err = k.run(w, f)
	}
	el := time.Since(start)
	w.opStart.Store(0)
	w.res.Ops++
	w.res.Kinds[k.name]++
	if el > w.res.Stall.Duration {
		w.res.Stall = Stall{Duration: el, Worker: w.index, Op: w.op, Desc: w.desc}
	}
	entry := fmt.Sprintf("#%d %s (%v)", w.op, w.desc, el.Round(time.Microsecond))
	if err != nil {
		entry += " error: " + err.Error()
	}
	w.history[w.op%historyLen] = entry
	if w.oplog != nil {
		fmt.Fprintln(w.oplog, entry)
	}
	if err != nil {
		w.res.Errors++
		w.logf("seed %d op #%d: %s: error: %v; resyncing %s from the server", w.cfg.Seed, w.op, w.desc, err, f.name)
		w.resync(f)
	}
}

// resync makes f's model what the server has after a failed operation
// (whose effect is unknown).
func (w *worker) resync(f *file) {
	if f.f != nil {
		f.f.Close()
		f.f = nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		w.logf("resync %s: %v (retried at its next operation)", f.name, err)
		return
	}
	f.model = data
}

func (w *worker) open(f *file) error {
	fd, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	f.f = fd
	return nil
}

func (w *worker) logf(format string, args ...any) {
	fmt.Fprintf(w.out, format+"\n", args...)
}

func (w *worker) progress() {
	w.logf("progress: ops=%d mismatches=%d errors=%d handoffs=%d files=%d longest_stall=%v (%s)",
		w.res.Ops, w.res.Mismatches, w.res.Errors, w.res.Handoffs, len(w.files),
		w.res.Stall.Duration.Round(time.Millisecond), w.res.Stall.Desc)
}

// watch reports an operation that runs longer than cfg.StallReport, once.
func (w *worker) watch() (stop func()) {
	done := make(chan struct{})
	t := time.NewTicker(time.Second)
	go func() {
		var reported int64
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			s := w.opStart.Load()
			if s == 0 || s == reported {
				continue
			}
			if el := time.Since(time.Unix(0, s)); el > w.cfg.StallReport {
				reported = s
				w.logf("stall: %s running for %v", *w.opDesc.Load(), el.Round(time.Second))
			}
		}
	}()
	return func() { t.Stop(); close(done) }
}

// randLen returns an access length in [1, max], mostly small.
func (w *worker) randLen(max int) int {
	switch w.rng.IntN(4) {
	case 0:
		return 1 + w.rng.IntN(min(max, 512))
	case 1:
		return 1 + w.rng.IntN(min(max, 8192))
	default:
		return 1 + w.rng.IntN(max)
	}
}

// randOff returns an offset for an access of a file of size n: mostly
// inside it, sometimes at or past its end (up to MaxLen-1).
func (w *worker) randOff(n int) int {
	if n == 0 || w.rng.IntN(8) == 0 {
		return w.rng.IntN(w.cfg.MaxLen)
	}
	off := w.rng.IntN(n)
	if w.rng.IntN(4) == 0 {
		off &^= 4095 // page aligned
	}
	return off
}

func (w *worker) fill(b []byte) { w.data.Read(b) }

// setModel writes data at off in f's model, growing it with zeros.
func setModel(f *file, off int, data []byte) {
	if end := off + len(data); end > len(f.model) {
		f.model = append(f.model, make([]byte, end-len(f.model))...)
	}
	copy(f.model[off:], data)
}

func resize(f *file, n int) {
	if n <= len(f.model) {
		f.model = f.model[:n]
		return
	}
	f.model = append(f.model, make([]byte, n-len(f.model))...)
}

func (w *worker) write(f *file) error {
	off := w.randOff(len(f.model))
	n := min(w.randLen(w.cfg.MaxOp), w.cfg.MaxLen-off)
	data := w.buf[:n]
	w.fill(data)
	w.desc = fmt.Sprintf("write %s off=%d len=%d size=%d", f.name, off, n, len(f.model))
	got, err := f.f.WriteAt(data, int64(off))
	w.res.Bytes += int64(got)
	setModel(f, off, data[:got]) // a short write wrote a prefix
	if err == nil && got != n {
		err = fmt.Errorf("short write: %d of %d bytes", got, n)
	}
	return err
}

func (w *worker) read(f *file) error {
	off := w.randOff(len(f.model))
	n := w.randLen(w.cfg.MaxOp)
	w.desc = fmt.Sprintf("read %s off=%d len=%d size=%d", f.name, off, n, len(f.model))
	buf := w.buf[:n]
	got, err := f.f.ReadAt(buf, int64(off))
	if err == io.EOF {
		err = nil
	}
	w.res.Bytes += int64(got)
	if err != nil {
		return err
	}
	w.check(f, "read", off, buf[:got], n)
	return nil
}

// check compares got, read at off with a request of want bytes, with the
// model, and reports a difference (also a short or long read).
func (w *worker) check(f *file, how string, off int, got []byte, want int) bool {
	var exp []byte
	if off < len(f.model) {
		exp = f.model[off:min(off+want, len(f.model))]
	}
	if bytes.Equal(got, exp) {
		return true
	}
	w.mismatch(f, how, off, exp, got)
	return false
}

func (w *worker) mismatch(f *file, how string, off int, exp, got []byte) {
	w.res.Mismatches++
	first := 0
	for first < len(exp) && first < len(got) && exp[first] == got[first] {
		first++
	}
	last := first
	for i := first; i < min(len(exp), len(got)); i++ {
		if exp[i] != got[i] {
			last = i
		}
	}
	if w.res.Mismatches <= maxReports {
		var b bytes.Buffer
		fmt.Fprintf(&b, "MISMATCH seed=%d worker=%d op=#%d (%s) %s file=%s (%s)\n", w.cfg.Seed, w.index, w.op, w.desc, how, f.name, f.path)
		fmt.Fprintf(&b, "  at offset %d (%#x): expected %d bytes, got %d; first difference at file offset %d, last at %d; model size %d\n",
			off, off, len(exp), len(got), off+first, off+last, len(f.model))
		lo := first &^ 15
		fmt.Fprintf(&b, "  expected @%d: % x\n", off+lo, exp[min(lo, len(exp)):min(lo+32, len(exp))])
		fmt.Fprintf(&b, "  got      @%d: % x\n", off+lo, got[min(lo, len(got)):min(lo+32, len(got))])
		fmt.Fprintf(&b, "  last operations on %s (newest last):\n", f.name)
		var lines []string
		for i := w.op - historyLen + 1; i <= w.op; i++ {
			if i < 1 {
				continue
			}
			if e := w.history[i%historyLen]; bytes.Contains([]byte(e), []byte(" "+f.name+" ")) {
				lines = append(lines, e)
			}
		}
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		for _, l := range lines {
			fmt.Fprintf(&b, "    %s\n", l)
		}
		w.logf("%s", bytes.TrimRight(b.Bytes(), "\n"))
	}
	// Take the server's bytes so one corruption is reported once.
	if len(got) < len(exp) && off+len(got) < len(f.model) {
		// A short read: the file is shorter than the model says.
		f.model = f.model[:off+len(got)]
	}
	setModel(f, off, got)
}

// mapped maps the first n bytes of f (n > 0) and calls fn on them. A fault
// (SIGBUS: the file is shorter on the server than n) is an error.
func mapped(f *file, n int, prot int, fn func(m []byte)) (err error) {
	m, err := syscall.Mmap(int(f.f.Fd()), 0, n, prot, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault in mapping of %d bytes: %v", n, r)
		}
		if uerr := syscall.Munmap(m); uerr != nil && err == nil {
			err = fmt.Errorf("munmap: %w", uerr)
		}
	}()
	fn(m)
	return nil
}

// checkSize compares the file's size with the model's.
func (w *worker) checkSize(f *file) error {
	st, err := f.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != int64(len(f.model)) {
		w.res.Mismatches++
		w.logf("MISMATCH seed=%d worker=%d op=#%d (%s) size of %s: expected %d, got %d", w.cfg.Seed, w.index, w.op, w.desc, f.name, len(f.model), st.Size())
		resize(f, int(st.Size()))
		return nil
	}
	return nil
}

func (w *worker) mapRead(f *file) error {
	size := len(f.model)
	if size == 0 {
		return w.read(f)
	}
	off := w.rng.IntN(size)
	n := min(w.randLen(w.cfg.MaxOp), size-off)
	w.desc = fmt.Sprintf("mapread %s off=%d len=%d size=%d", f.name, off, n, size)
	if err := w.checkSize(f); err != nil || len(f.model) != size {
		return err
	}
	buf := w.buf[:n]
	if err := mapped(f, size, syscall.PROT_READ, func(m []byte) { copy(buf, m[off:off+n]) }); err != nil {
		return err
	}
	w.res.Bytes += int64(n)
	w.check(f, "mapread", off, buf, n)
	return nil
}

func (w *worker) mapWrite(f *file) error {
	off := w.randOff(len(f.model))
	n := min(w.randLen(w.cfg.MaxOp), w.cfg.MaxLen-off)
	data := w.buf[:n]
	w.fill(data)
	sync := w.rng.IntN(2) == 0
	w.desc = fmt.Sprintf("mapwrite %s off=%d len=%d size=%d msync=%v", f.name, off, n, len(f.model), sync)
	if err := w.checkSize(f); err != nil {
		return err
	}
	if end := off + n; end > len(f.model) {
		// As fsx: extend first, then write through the mapping.
		if err := f.f.Truncate(int64(end)); err != nil {
			return fmt.Errorf("extend to %d: %w", end, err)
		}
		resize(f, end)
	}
	err := mapped(f, len(f.model), syscall.PROT_READ|syscall.PROT_WRITE, func(m []byte) {
		copy(m[off:], data)
		if sync {
			if err := unix.Msync(m, unix.MS_SYNC); err != nil {
				panic(fmt.Sprintf("msync: %v", err))
			}
		}
	})
	w.res.Bytes += int64(n)
	setModel(f, off, data)
	return err
}

func (w *worker) truncate(f *file) error {
	var n int
	if w.rng.IntN(2) == 0 && len(f.model) > 0 {
		n = w.rng.IntN(len(f.model) + 1) // shrink
	} else {
		n = len(f.model) + w.rng.IntN(w.cfg.MaxLen-len(f.model)+1) // extend
	}
	w.desc = fmt.Sprintf("truncate %s from=%d to=%d", f.name, len(f.model), n)
	if err := f.f.Truncate(int64(n)); err != nil {
		return err
	}
	resize(f, n)
	return nil
}

func (w *worker) fsync(f *file) error {
	w.desc = fmt.Sprintf("fsync %s size=%d", f.name, len(f.model))
	return f.f.Sync()
}

func (w *worker) reopen(f *file) error {
	w.desc = fmt.Sprintf("reopen %s size=%d", f.name, len(f.model))
	if err := f.f.Close(); err != nil {
		f.f = nil
		return fmt.Errorf("close: %w", err)
	}
	f.f = nil
	return w.open(f)
}

// verifyAll checks f's size and reads all of it.
func (w *worker) verifyAll(f *file) error {
	w.desc = fmt.Sprintf("verify %s size=%d", f.name, len(f.model))
	return w.verifyContents(f)
}

func (w *worker) verifyContents(f *file) error {
	if err := w.checkSize(f); err != nil {
		return err
	}
	size := len(f.model)
	buf := w.buf[:size+1]
	got, err := f.f.ReadAt(buf, 0)
	if err == io.EOF {
		err = nil
	}
	w.res.Bytes += int64(got)
	if err != nil {
		return err
	}
	w.check(f, "verify", 0, buf[:got], size+1)
	return nil
}

// finalVerify checks f through a fresh open, as another program would.
func (w *worker) finalVerify(f *file) error {
	if err := w.reopen(f); err != nil {
		return err
	}
	w.desc = fmt.Sprintf("final-verify %s size=%d", f.name, len(f.model))
	return w.verifyContents(f)
}

// lineBuffer is a buffered writer flushed by flush; the op log can be big.
type lineBuffer struct {
	mu sync.Mutex
	w  io.Writer
	b  []byte
}

func newLineBuffer(w io.Writer) *lineBuffer { return &lineBuffer{w: w} }

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > 64<<10 {
		_, err := l.w.Write(l.b)
		l.b = l.b[:0]
		return len(p), err
	}
	return len(p), nil
}

func (l *lineBuffer) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(l.b)
	l.b = l.b[:0]
}
