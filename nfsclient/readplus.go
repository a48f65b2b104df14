package nfsclient

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// readPlusOp is READ_PLUS (RFC 7862 s15.10): the reply lists data
// segments and holes. Data is copied into dest, holes are zeroed there:
// the caller sees what READ would give. Its result is decoded by hand so
// that the data goes straight to dest (read_plus_res4 in nfs4.x).
//
// RFC 8267 s4.1 makes only READ's data and READLINK's text DDP-eligible
// in a reply: READ_PLUS's data is not, so over RPC-over-RDMA it comes
// inline or in a Reply chunk, never in a Write chunk (ReplyBulk, ulb.go,
// says so), and costs a copy that READ does not.
type readPlusOp struct {
	args  readPlus4args
	dest  []byte
	n     int
	eof   bool
	holes int // bytes of dest that were holes
}

func (*readPlusOp) num() uint32 { return opReadPlus }

func (o *readPlusOp) encodeArgs(cp *compound) {
	o.args.encode(&cp.e)
	// Segments add their headers to the data: 24 bytes a segment at
	// most, and a hole takes no data.
	cp.maxRep += len(o.dest) + 4096
}

// maxReadPlusSegments bounds the segments of one reply.
const maxReadPlusSegments = 1 << 16

func (o *readPlusOp) decodeRes(r *results) error {
	d := &r.d
	o.eof = d.Bool()
	nseg := d.Length(maxReadPlusSegments)
	pos := 0 // bytes of dest filled
	for range nseg {
		what := d.Uint32()
		off := d.Uint64()
		if d.Err() != nil {
			break
		}
		// Segments follow each other from the offset asked for.
		if off != o.args.offset+uint64(pos) {
			return fmt.Errorf("%w: READ_PLUS segment at %d, want %d", ErrProtocol, off, o.args.offset+uint64(pos))
		}
		switch what {
		case nfs4ContentData:
			data := d.Opaque(len(o.dest) - pos)
			if d.Err() != nil {
				break
			}
			pos += copy(o.dest[pos:], data)
			r.copied += len(data)
		case nfs4ContentHole:
			n := d.Uint64()
			// A hole may reach past what was asked (RFC 7862 s15.10.3).
			l := int(min(n, uint64(len(o.dest)-pos)))
			clear(o.dest[pos : pos+l])
			pos += l
			o.holes += l
			if l < int(min(n, 1<<62)) && d.Err() == nil {
				o.eof = false // the rest is for the next call
			}
		default:
			return fmt.Errorf("%w: READ_PLUS segment type %d", ErrProtocol, what)
		}
	}
	if err := r.check(opReadPlus); err != nil {
		return err
	}
	if pos == 0 && !o.eof && len(o.dest) > 0 {
		// Zero bytes before the end would read as end of file to the
		// caller's caller: nfs-ganesha 4.3 answers so for data it has.
		return fmt.Errorf("%w: READ_PLUS returned no data and no EOF", ErrProtocol)
	}
	o.n = pos
	return nil
}

// ReadPlus reads up to len(dest) bytes at off of the file fh open with
// sid, as Read does, with READ_PLUS (RFC 7862 s15.10): holes come back as
// short descriptions instead of zeros (holes reports how many bytes of
// dest they were). Over RPC-over-RDMA its data is not placed directly
// (see readPlusOp): Read is cheaper there for dense files.
func (c *Client) ReadPlus(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, dest []byte) (n int, eof bool, holes int, err error) {
	if err := c.need42("READ_PLUS"); err != nil {
		return 0, false, 0, err
	}
	op := &readPlusOp{dest: dest}
	err = c.do(ctx, cred, func(cp *compound) {
		*op = readPlusOp{args: readPlus4args{stateid: c.sid(cp, sid), offset: off, count: uint32(len(dest))}, dest: dest}
		cp.putFH(fh)
		cp.add(op)
	})
	return op.n, op.eof, op.holes, err
}
