// Package trace is rdmafs's event tracing: one line per protocol event,
// enabled per category (the -v flag), cheap when off.
//
//	tr := trace.New(os.Stderr, trace.RPC|trace.NFS)
//	if tr.On(trace.NFS) {
//		tr.Printf(trace.NFS, "xid=%#x op=READ status=%v", xid, st)
//	}
package trace

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Category selects a group of trace events.
type Category uint32

// Trace categories, named as on the command line.
const (
	RPC Category = 1 << iota
	NFS
	FUSE
	RDMA
	MR
	Verbs
	All = RPC | NFS | FUSE | RDMA | MR | Verbs
)

var names = []struct {
	name string
	cat  Category
}{{"rpc", RPC}, {"nfs", NFS}, {"fuse", FUSE}, {"rdma", RDMA}, {"mr", MR}, {"verbs", Verbs}, {"all", All}}

func (c Category) String() string {
	var parts []string
	for _, n := range names[:len(names)-1] {
		if c&n.cat != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, ",")
}

// Parse turns a list such as "nfs,rpc" or "all" into categories.
func Parse(list string) (Category, error) {
	var c Category
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		found := false
		for _, n := range names {
			if strings.EqualFold(f, n.name) {
				c |= n.cat
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown trace category %q (want rpc, nfs, fuse, rdma, mr, verbs or all)", f)
		}
	}
	return c, nil
}

// Tracer writes trace lines for its enabled categories. A nil *Tracer is
// valid and traces nothing.
type Tracer struct {
	cats Category
	mu   sync.Mutex
	w    io.Writer
	buf  []byte
}

// New returns a Tracer writing the categories cats to w.
func New(w io.Writer, cats Category) *Tracer { return &Tracer{w: w, cats: cats} }

// On reports whether category c is traced. Call it before building the
// arguments of Printf so that disabled tracing costs one branch.
func (t *Tracer) On(c Category) bool { return t != nil && t.cats&c != 0 }

// Printf writes one line: a timestamp, the category and the message.
func (t *Tracer) Printf(c Category, format string, args ...any) {
	if !t.On(c) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = time.Now().AppendFormat(t.buf[:0], "15:04:05.000000")
	t.buf = append(t.buf, ' ')
	t.buf = append(t.buf, c.String()...)
	t.buf = append(t.buf, ' ')
	t.buf = fmt.Appendf(t.buf, format, args...)
	t.buf = append(t.buf, '\n')
	t.w.Write(t.buf)
}
