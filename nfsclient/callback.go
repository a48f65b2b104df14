package nfsclient

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Callback program (RFC 8881 s20): version 1, CB_NULL and CB_COMPOUND.
const (
	cbVersion      = 1
	cbProcNull     = 0
	cbProcCompound = 1

	opCBGetAttr       = 3
	opCBRecall        = 4
	opCBLayoutRecall  = 5
	opCBNotify        = 6
	opCBPushDeleg     = 7
	opCBRecallAny     = 8
	opCBRecallableObj = 9
	opCBRecallSlot    = 10
	opCBSequence      = 11
	opCBWantsCancel   = 12
	opCBNotifyLock    = 13
	opCBNotifyDevID   = 14
	opCBOffload       = 15
	opCBIllegal       = 10044

	// cbSlots is the number of back channel slots we ask for.
	cbSlots = 4
	// cbMaxRequestSize is the largest CB_COMPOUND call we ask to get.
	cbMaxRequestSize = 4096
)

// callbackServer serves the NFSv4.1 callback program on the back channel
// (RFC 8881 s20): CB_NULL, and CB_COMPOUND with CB_SEQUENCE, CB_RECALL
// and CB_RECALL_ANY (delegations, deleg.go), CB_NOTIFY_LOCK (s20.11: a
// blocked LOCK may retry, lock.go) and CB_OFFLOAD (RFC 7862 s16.1: an
// asynchronous COPY ended, nfs42.go). The other callback operations get
// NFS4ERR_NOTSUPP, unknown ones NFS4ERR_OP_ILLEGAL.
type callbackServer struct {
	c *Client

	mu        sync.Mutex
	sessionID SessionID
	slots     []cbSlot
	delegs    delegTable // delegations held, their recalls (deleg.go)
	recalls   int
	onRecall  RecallHandler

	locks lockWaiters // blocked LOCKs, woken by CB_NOTIFY_LOCK
}

// cbSlot is the back channel replay cache of one slot (RFC 8881 s2.10.6).
type cbSlot struct {
	seq   uint32
	reply []byte // the last reply, resent when the same sequence comes again
}

func newCallbackServer(c *Client) *callbackServer {
	return &callbackServer{c: c, delegs: newDelegTable()}
}

// backChannelLimits returns the back channel's ca_maxrequests and
// ca_maxrequestsize as CREATE_SESSION negotiated them (RFC 8881 s18.36),
// within what the client offered and its slot table holds: the transport
// serves no more calls at once, and refuses larger ones (HandleTooBig).
func backChannelLimits(back channelAttrs4) (calls, size int) {
	calls = max(1, min(int(back.maxrequests), 64))
	size = cbMaxRequestSize
	if back.maxrequestsize > 0 && back.maxrequestsize < cbMaxRequestSize {
		size = int(back.maxrequestsize)
	}
	return calls, size
}

func (s *callbackServer) setSession(id SessionID, nslots int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessionID = id
	s.slots = make([]cbSlot, max(1, min(nslots, 64)))
}

// HandleCall serves one backward-direction RPC call.
func (s *callbackServer) HandleCall(msg []byte) []byte {
	h, args, err := oncrpc.ParseCall(msg)
	if err != nil {
		s.c.trace("callback: dropping malformed call: %v", err)
		return nil
	}
	var e xdr.Encoder
	switch {
	case h.Prog != cbProgram:
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProgUnavail, 0, 0)
	case h.Vers != cbVersion:
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProgMismatch, cbVersion, cbVersion)
	case h.Proc == cbProcNull:
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
	case h.Proc == cbProcCompound:
		res, err := s.compound(args)
		if err != nil {
			s.c.trace("callback xid=%#x: %v", h.XID, err)
			oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.GarbageArgs, 0, 0)
			break
		}
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
		return append(e.Bytes(), res...)
	default:
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProcUnavail, 0, 0)
	}
	return e.Bytes()
}

// HandleTooBig answers a backward call larger than the back channel's
// ca_maxrequestsize, of which the transport read only head (size bytes
// in all): a CB_COMPOUND gets NFS4ERR_REQ_TOO_BIG from its CB_SEQUENCE
// (RFC 8881 s18.36.3: "If a requester sends a request that exceeds
// ca_maxrequestsize, the error NFS4ERR_REQ_TOO_BIG will be returned per
// the description in Section 2.10.6.4"; s20.9.3 lists it for
// CB_SEQUENCE), as a server's SEQUENCE answers on the fore channel.
// Anything else, or a call whose head does not hold the CB_COMPOUND's
// first operation, gets no reply.
func (s *callbackServer) HandleTooBig(head []byte, size int) []byte {
	h, args, err := oncrpc.ParseCall(head)
	if err != nil || h.Prog != cbProgram || h.Vers != cbVersion || h.Proc != cbProcCompound {
		s.c.trace("callback: dropping a %d-byte call beyond the back channel's limit", size)
		return nil
	}
	d := xdr.NewDecoder(args)
	tag := d.Opaque(maxTagLen)
	d.Uint32() // minorversion
	d.Uint32() // callback_ident
	nops := d.Uint32()
	op := d.Uint32()
	if d.Err() != nil || nops == 0 || op != opCBSequence {
		s.c.trace("callback xid=%#x: dropping a %d-byte call beyond the back channel's limit", h.XID, size)
		return nil
	}
	s.c.trace("callback xid=%#x: %d bytes, beyond the back channel's limit: NFS4ERR_REQ_TOO_BIG", h.XID, size)
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
	e.Uint32(uint32(ErrReqTooBig))
	e.Opaque(tag)
	e.Uint32(1)
	e.Uint32(opCBSequence)
	e.Uint32(uint32(ErrReqTooBig))
	return e.Bytes()
}

// cbResults collects CB_COMPOUND results.
type cbResults struct {
	e      xdr.Encoder
	n      int
	status Status
}

func (r *cbResults) add(op uint32, st Status) {
	r.e.Uint32(op)
	r.e.Uint32(uint32(st))
	r.n++
	r.status = st
}

// compound decodes and runs a CB_COMPOUND (RFC 8881 s20.2) and returns
// the encoded CB_COMPOUND4res. It returns an error only for arguments it
// cannot decode at all (answered with GARBAGE_ARGS).
func (s *callbackServer) compound(args []byte) ([]byte, error) {
	d := xdr.NewDecoder(args)
	tag := d.Opaque(maxTagLen)
	minor := d.Uint32()
	d.Uint32() // callback_ident: unused in 4.1
	nops := d.Length(maxCompoundOps)
	if err := d.Err(); err != nil {
		return nil, err
	}
	var r cbResults
	var slot *cbSlot
	var slotSeq uint32
	// RFC 7862 s16 (and RFC 8881 s20.2): the callback's minor version is
	// the session's.
	if minor != minorVersion1 && minor != minorVersion2 {
		r.status = ErrMinorVersMismatch
		nops = 0
	}
	for i := 0; i < nops && r.status == StatusOK; i++ {
		op := d.Uint32()
		if d.Err() != nil {
			return nil, d.Err()
		}
		if i == 0 && op != opCBSequence {
			r.add(op, ErrOpNotInSession) // RFC 8881 s20.9.3
			break
		}
		switch op {
		case opCBSequence:
			if i != 0 {
				r.add(op, ErrSequencePos)
				break
			}
			var cached []byte
			var st Status
			slot, slotSeq, cached, st = s.sequence(d, &r)
			if cached != nil {
				return cached, nil // replay: resend the cached reply
			}
			if st != StatusOK {
				r.add(op, st)
			}
		case opCBRecall:
			sid := decodeStateID(d)
			d.Bool() // truncate
			fh := d.Opaque(maxFHSize)
			if d.Err() != nil {
				r.add(op, ErrBadXDR)
				break
			}
			r.add(op, s.recall(sid, fh))
		case opCBRecallAny:
			d.Uint32() // objects to keep
			decodeBitmap(d)
			if d.Err() != nil {
				r.add(op, ErrBadXDR)
				break
			}
			s.recallAll()
			r.add(op, StatusOK)
		case opCBNotifyLock:
			// RFC 8881 s20.11: a lock this client waits for may be free.
			fh, clientID, owner, err := decodeNotifyLock(d)
			if err != nil {
				r.add(op, ErrBadXDR)
				break
			}
			s.locks.notify(fh, clientID, owner)
			r.add(op, StatusOK)
		case opCBOffload:
			// RFC 7862 s16.1: an asynchronous COPY finished.
			var a cbOffload4args
			a.decode(d)
			if d.Err() != nil {
				r.add(op, ErrBadXDR)
				break
			}
			s.c.copies.done(a.stateid, copyOutcome(&a.info))
			r.add(op, StatusOK)
		case opCBGetAttr, opCBLayoutRecall, opCBNotify, opCBPushDeleg, opCBRecallableObj,
			opCBRecallSlot, opCBWantsCancel, opCBNotifyDevID:
			r.add(op, ErrNotSupp)
		default:
			r.add(opCBIllegal, ErrOpIllegal)
		}
	}
	var out xdr.Encoder
	out.Uint32(uint32(r.status))
	out.Opaque(tag)
	out.Uint32(uint32(r.n))
	res := append(out.Bytes(), r.e.Bytes()...)
	if slot != nil {
		s.mu.Lock()
		slot.seq = slotSeq
		slot.reply = res
		s.mu.Unlock()
	}
	return res, nil
}

// sequence checks a CB_SEQUENCE (RFC 8881 s20.9) and appends its result.
// It returns the slot to cache the reply in, or a cached reply to resend.
func (s *callbackServer) sequence(d *xdr.Decoder, r *cbResults) (*cbSlot, uint32, []byte, Status) {
	var id SessionID
	copy(id[:], d.FixedOpaque(16))
	seq := d.Uint32()
	slotID := d.Uint32()
	highest := d.Uint32()
	d.Bool() // cachethis
	nlists := d.Length(64)
	for range nlists {
		d.FixedOpaque(16)
		n := d.Length(1024)
		for range n {
			d.Uint32()
			d.Uint32()
		}
	}
	if d.Err() != nil {
		return nil, 0, nil, ErrBadXDR
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != s.sessionID {
		return nil, 0, nil, ErrBadSession
	}
	if int(slotID) >= len(s.slots) {
		return nil, 0, nil, ErrBadSlot
	}
	sl := &s.slots[slotID]
	switch {
	case seq == sl.seq && sl.reply != nil:
		return nil, 0, sl.reply, StatusOK
	case seq != sl.seq+1:
		return nil, 0, nil, ErrSeqMisordered
	}
	r.add(opCBSequence, StatusOK)
	r.e.FixedOpaque(id[:])
	r.e.Uint32(seq)
	r.e.Uint32(slotID)
	r.e.Uint32(highest)
	r.e.Uint32(uint32(len(s.slots) - 1))
	return sl, seq, nil, StatusOK
}

func (c *Client) delegReturn(ctx context.Context, sid StateID, fh []byte) error {
	// An operation on the file: in the mount's flavor, as mountRoot.
	err := c.do(ctx, c.Cred(0, 0, nil), func(cp *compound) {
		cp.putFH(fh)
		cp.add(&delegReturnOp{args: delegreturn4args{delegStateid: sid}})
	})
	if err != nil {
		return fmt.Errorf("DELEGRETURN: %w", err)
	}
	return nil
}
