package uring

import (
	"encoding/binary"
	"testing"
	"unsafe"
)

// TestABISizes checks the structures shared with the kernel against
// the sizes of include/uapi/linux/io_uring.h.
func TestABISizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_sqe (SQE128)", unsafe.Sizeof(sqe{}), sqeSize},
		{"io_uring_cqe", unsafe.Sizeof(cqe{}), cqeSize},
		{"io_uring_params", unsafe.Sizeof(params{}), 120},
		{"sqe.user_data offset", unsafe.Offsetof(sqe{}.UserData), 32},
		{"sqe.cmd offset", unsafe.Offsetof(sqe{}.Cmd), 48},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0", 1, true},
		{"0-1", 2, true},
		{"0-3,8-11", 8, true},
		{"0,2,4", 3, true},
		{"", 0, false},
		{"3-1", 0, false},
		{"a-b", 0, false},
		{"0-99999999", 0, false},
		{"-1", 0, false},
	} {
		n, err := parseCPUList(c.in)
		if (err == nil) != c.ok || n != c.want {
			t.Errorf("parseCPUList(%q) = %d, %v; want %d, ok %v", c.in, n, err, c.want, c.ok)
		}
	}
}

// ringRequest fills a header buffer as the kernel does for a request
// of total bytes with payload bytes of payload.
func ringRequest(total, payload uint32) []byte {
	h := make([]byte, hdrSize)
	binary.NativeEndian.PutUint32(h[0:], total)
	binary.NativeEndian.PutUint32(h[4:], 15) // FUSE_READ
	binary.NativeEndian.PutUint32(h[hdrPayloadSize:], payload)
	return h
}

func TestSplitRequest(t *testing.T) {
	pay := make([]byte, 8192)
	// READ: in_header + fuse_read_in (40 bytes), no payload.
	hdr, op, p, err := splitRequest(ringRequest(80, 0), pay)
	if err != nil || len(hdr) != inHeaderSize || len(op) != 40 || len(p) != 0 {
		t.Errorf("READ: %d %d %d %v", len(hdr), len(op), len(p), err)
	}
	// WRITE of 4096 bytes: fuse_write_in (40) and the data.
	hdr, op, p, err = splitRequest(ringRequest(40+40+4096, 4096), pay)
	if err != nil || len(op) != 40 || len(p) != 4096 {
		t.Errorf("WRITE: %d %d %d %v", len(hdr), len(op), len(p), err)
	}
	for _, c := range []struct {
		name           string
		total, payload uint32
		header         int
	}{
		{"payload past the buffer", 40 + 9000, 9000, hdrSize},
		{"shorter than its header", 30, 0, hdrSize},
		{"payload larger than the request", 100, 200, hdrSize},
		{"operation header past op_in", 40 + 129, 0, hdrSize},
		{"short ring header", 80, 0, hdrSize - 1},
	} {
		h := ringRequest(c.total, c.payload)[:c.header]
		if _, _, _, err := splitRequest(h, pay); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// FuzzSplitRequest: whatever the header says, the parts lie within the
// buffers and add up to the request's length.
func FuzzSplitRequest(f *testing.F) {
	f.Add(ringRequest(80, 0), 8192)
	f.Add(ringRequest(4176, 4096), 4096)
	f.Add([]byte{1, 2, 3}, 0)
	f.Fuzz(func(t *testing.T, header []byte, payLen int) {
		if payLen < 0 || payLen > 1<<20 {
			return
		}
		pay := make([]byte, payLen)
		hdr, op, p, err := splitRequest(header, pay)
		if err != nil {
			return
		}
		total := binary.NativeEndian.Uint32(header)
		if len(hdr) != inHeaderSize || len(op) > opInMax || len(p) > payLen ||
			uint32(len(hdr)+len(op)+len(p)) != total {
			t.Fatalf("split %d bytes into %d+%d+%d", total, len(hdr), len(op), len(p))
		}
	})
}
