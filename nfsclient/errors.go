package nfsclient

import (
	"errors"
	"fmt"
	"syscall"
)

// Status is an NFSv4 status code (nfsstat4, RFC 8881 s15.1). A non-zero
// Status is an error; Errno maps it to what a POSIX caller expects.
type Status uint32

// Status codes the client handles by name.
const (
	StatusOK             Status = 0
	ErrPerm              Status = 1
	ErrNoEnt             Status = 2
	ErrIO                Status = 5
	ErrNXIO              Status = 6
	ErrAccess            Status = 13
	ErrExist             Status = 17
	ErrXDev              Status = 18
	ErrNotDir            Status = 20
	ErrIsDir             Status = 21
	ErrInval             Status = 22
	ErrFBig              Status = 27
	ErrNoSpc             Status = 28
	ErrROFS              Status = 30
	ErrMLink             Status = 31
	ErrNameTooLong       Status = 63
	ErrNotEmpty          Status = 66
	ErrDQuot             Status = 69
	ErrStale             Status = 70
	ErrBadHandle         Status = 10001
	ErrBadCookie         Status = 10003
	ErrNotSupp           Status = 10004
	ErrTooSmall          Status = 10005
	ErrServerFault       Status = 10006
	ErrBadType           Status = 10007
	ErrDelay             Status = 10008
	ErrSame              Status = 10009
	ErrDenied            Status = 10010
	ErrExpired           Status = 10011
	ErrLocked            Status = 10012
	ErrGrace             Status = 10013
	ErrFHExpired         Status = 10014
	ErrShareDenied       Status = 10015
	ErrWrongSec          Status = 10016
	ErrClidInUse         Status = 10017
	ErrResource          Status = 10018
	ErrMoved             Status = 10019
	ErrNoFileHandle      Status = 10020
	ErrMinorVersMismatch Status = 10021
	ErrStaleClientID     Status = 10022
	ErrStaleStateID      Status = 10023
	ErrOldStateID        Status = 10024
	ErrBadStateID        Status = 10025
	ErrBadSeqID          Status = 10026
	ErrNotSame           Status = 10027
	ErrLockRange         Status = 10028
	ErrSymlink           Status = 10029
	ErrRestoreFH         Status = 10030
	ErrLeaseMoved        Status = 10031
	ErrAttrNotSupp       Status = 10032
	ErrNoGrace           Status = 10033
	ErrReclaimBad        Status = 10034
	ErrReclaimConflict   Status = 10035
	ErrBadXDR            Status = 10036
	ErrLocksHeld         Status = 10037
	ErrOpenMode          Status = 10038
	ErrBadOwner          Status = 10039
	ErrBadChar           Status = 10040
	ErrBadName           Status = 10041
	ErrBadRange          Status = 10042
	ErrLockNotSupp       Status = 10043
	ErrOpIllegal         Status = 10044
	ErrDeadlock          Status = 10045
	ErrFileOpen          Status = 10046
	ErrAdminRevoked      Status = 10047
	ErrCBPathDown        Status = 10048
	ErrBadSession        Status = 10052
	ErrBadSlot           Status = 10053
	ErrCompleteAlready   Status = 10054
	ErrConnNotBound      Status = 10055
	ErrBackChanBusy      Status = 10057
	ErrSeqMisordered     Status = 10063
	ErrSequencePos       Status = 10064
	ErrReqTooBig         Status = 10065
	ErrRepTooBig         Status = 10066
	ErrRepTooBigToCache  Status = 10067
	ErrRetryUncachedRep  Status = 10068
	ErrTooManyOps        Status = 10070
	ErrOpNotInSession    Status = 10071
	ErrClientIDBusy      Status = 10074
	ErrSeqFalseRetry     Status = 10076
	ErrBadHighSlot       Status = 10077
	ErrDeadSession       Status = 10078
	ErrNotOnlyOp         Status = 10081
	ErrWrongCred         Status = 10082
	ErrWrongType         Status = 10083
	ErrDelegRevoked      Status = 10087

	// NFSv4.2 (RFC 7862 s11.1) and extended attributes (RFC 8276 s8.1).
	ErrPartnerNotSupp Status = 10088
	ErrPartnerNoAuth  Status = 10089
	ErrUnionNotSupp   Status = 10090
	ErrOffloadDenied  Status = 10091
	ErrWrongLFS       Status = 10092
	ErrBadLabel       Status = 10093
	ErrOffloadNoReqs  Status = 10094
	ErrNoXattr        Status = 10095
	ErrXattr2Big      Status = 10096
)

var statusNames = map[Status]string{
	StatusOK: "NFS4_OK", ErrPerm: "NFS4ERR_PERM", ErrNoEnt: "NFS4ERR_NOENT", ErrIO: "NFS4ERR_IO",
	ErrNXIO: "NFS4ERR_NXIO", ErrAccess: "NFS4ERR_ACCESS", ErrExist: "NFS4ERR_EXIST",
	ErrXDev: "NFS4ERR_XDEV", ErrNotDir: "NFS4ERR_NOTDIR", ErrIsDir: "NFS4ERR_ISDIR",
	ErrInval: "NFS4ERR_INVAL", ErrFBig: "NFS4ERR_FBIG", ErrNoSpc: "NFS4ERR_NOSPC",
	ErrROFS: "NFS4ERR_ROFS", ErrMLink: "NFS4ERR_MLINK", ErrNameTooLong: "NFS4ERR_NAMETOOLONG",
	ErrNotEmpty: "NFS4ERR_NOTEMPTY", ErrDQuot: "NFS4ERR_DQUOT", ErrStale: "NFS4ERR_STALE",
	ErrBadHandle: "NFS4ERR_BADHANDLE", ErrBadCookie: "NFS4ERR_BAD_COOKIE",
	ErrNotSupp: "NFS4ERR_NOTSUPP", ErrTooSmall: "NFS4ERR_TOOSMALL",
	ErrServerFault: "NFS4ERR_SERVERFAULT", ErrBadType: "NFS4ERR_BADTYPE", ErrDelay: "NFS4ERR_DELAY",
	ErrSame: "NFS4ERR_SAME", ErrDenied: "NFS4ERR_DENIED", ErrExpired: "NFS4ERR_EXPIRED",
	ErrLocked: "NFS4ERR_LOCKED", ErrGrace: "NFS4ERR_GRACE", ErrFHExpired: "NFS4ERR_FHEXPIRED",
	ErrShareDenied: "NFS4ERR_SHARE_DENIED", ErrWrongSec: "NFS4ERR_WRONGSEC",
	ErrClidInUse: "NFS4ERR_CLID_INUSE", ErrResource: "NFS4ERR_RESOURCE", ErrMoved: "NFS4ERR_MOVED",
	ErrNoFileHandle: "NFS4ERR_NOFILEHANDLE", ErrMinorVersMismatch: "NFS4ERR_MINOR_VERS_MISMATCH",
	ErrStaleClientID: "NFS4ERR_STALE_CLIENTID", ErrStaleStateID: "NFS4ERR_STALE_STATEID",
	ErrOldStateID: "NFS4ERR_OLD_STATEID", ErrBadStateID: "NFS4ERR_BAD_STATEID",
	ErrBadSeqID: "NFS4ERR_BAD_SEQID", ErrNotSame: "NFS4ERR_NOT_SAME", ErrLockRange: "NFS4ERR_LOCK_RANGE",
	ErrSymlink: "NFS4ERR_SYMLINK", ErrRestoreFH: "NFS4ERR_RESTOREFH", ErrLeaseMoved: "NFS4ERR_LEASE_MOVED",
	ErrAttrNotSupp: "NFS4ERR_ATTRNOTSUPP", ErrNoGrace: "NFS4ERR_NO_GRACE",
	ErrReclaimBad: "NFS4ERR_RECLAIM_BAD", ErrReclaimConflict: "NFS4ERR_RECLAIM_CONFLICT",
	ErrBadXDR: "NFS4ERR_BADXDR", ErrLocksHeld: "NFS4ERR_LOCKS_HELD", ErrOpenMode: "NFS4ERR_OPENMODE",
	ErrBadOwner: "NFS4ERR_BADOWNER", ErrBadChar: "NFS4ERR_BADCHAR", ErrBadName: "NFS4ERR_BADNAME",
	ErrBadRange: "NFS4ERR_BAD_RANGE", ErrLockNotSupp: "NFS4ERR_LOCK_NOTSUPP",
	ErrOpIllegal: "NFS4ERR_OP_ILLEGAL", ErrDeadlock: "NFS4ERR_DEADLOCK", ErrFileOpen: "NFS4ERR_FILE_OPEN",
	ErrAdminRevoked: "NFS4ERR_ADMIN_REVOKED", ErrCBPathDown: "NFS4ERR_CB_PATH_DOWN",
	ErrBadSession: "NFS4ERR_BADSESSION", ErrBadSlot: "NFS4ERR_BADSLOT",
	ErrCompleteAlready: "NFS4ERR_COMPLETE_ALREADY", ErrConnNotBound: "NFS4ERR_CONN_NOT_BOUND_TO_SESSION",
	ErrBackChanBusy: "NFS4ERR_BACK_CHAN_BUSY", ErrSeqMisordered: "NFS4ERR_SEQ_MISORDERED",
	ErrSequencePos: "NFS4ERR_SEQUENCE_POS", ErrReqTooBig: "NFS4ERR_REQ_TOO_BIG",
	ErrRepTooBig: "NFS4ERR_REP_TOO_BIG", ErrRepTooBigToCache: "NFS4ERR_REP_TOO_BIG_TO_CACHE",
	ErrRetryUncachedRep: "NFS4ERR_RETRY_UNCACHED_REP", ErrTooManyOps: "NFS4ERR_TOO_MANY_OPS",
	ErrOpNotInSession: "NFS4ERR_OP_NOT_IN_SESSION", ErrClientIDBusy: "NFS4ERR_CLIENTID_BUSY",
	ErrSeqFalseRetry: "NFS4ERR_SEQ_FALSE_RETRY", ErrBadHighSlot: "NFS4ERR_BAD_HIGH_SLOT",
	ErrDeadSession: "NFS4ERR_DEADSESSION", ErrNotOnlyOp: "NFS4ERR_NOT_ONLY_OP",
	ErrWrongCred: "NFS4ERR_WRONG_CRED", ErrWrongType: "NFS4ERR_WRONG_TYPE",
	ErrDelegRevoked:   "NFS4ERR_DELEG_REVOKED",
	ErrPartnerNotSupp: "NFS4ERR_PARTNER_NOTSUPP", ErrPartnerNoAuth: "NFS4ERR_PARTNER_NO_AUTH",
	ErrUnionNotSupp: "NFS4ERR_UNION_NOTSUPP", ErrOffloadDenied: "NFS4ERR_OFFLOAD_DENIED",
	ErrWrongLFS: "NFS4ERR_WRONG_LFS", ErrBadLabel: "NFS4ERR_BADLABEL",
	ErrOffloadNoReqs: "NFS4ERR_OFFLOAD_NO_REQS", ErrNoXattr: "NFS4ERR_NOXATTR",
	ErrXattr2Big: "NFS4ERR_XATTR2BIG",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("NFS4ERR(%d)", uint32(s))
}

func (s Status) Error() string { return "nfs: " + s.String() }

// Errno maps the status to the errno a user of a local file system would
// see (the mapping follows Linux's nfs4_stat_to_errno).
func (s Status) Errno() syscall.Errno {
	switch s {
	case StatusOK:
		return 0
	case ErrPerm:
		return syscall.EPERM
	case ErrNoEnt:
		return syscall.ENOENT
	case ErrNXIO:
		return syscall.ENXIO
	case ErrAccess, ErrWrongCred:
		return syscall.EACCES
	case ErrExist:
		return syscall.EEXIST
	case ErrXDev:
		return syscall.EXDEV
	case ErrNotDir:
		return syscall.ENOTDIR
	case ErrIsDir:
		return syscall.EISDIR
	case ErrInval, ErrBadType, ErrBadRange, ErrBadOwner, ErrBadChar, ErrBadXDR, ErrWrongType:
		return syscall.EINVAL
	case ErrFBig:
		return syscall.EFBIG
	case ErrNoSpc:
		return syscall.ENOSPC
	case ErrROFS:
		return syscall.EROFS
	case ErrMLink:
		return syscall.EMLINK
	case ErrNameTooLong:
		return syscall.ENAMETOOLONG
	case ErrNotEmpty:
		return syscall.ENOTEMPTY
	case ErrDQuot:
		return syscall.EDQUOT
	case ErrStale, ErrFHExpired, ErrBadHandle, ErrMoved:
		return syscall.ESTALE
	case ErrNotSupp, ErrAttrNotSupp, ErrLockNotSupp, ErrOpIllegal:
		return syscall.EOPNOTSUPP
	case ErrOffloadDenied, ErrOffloadNoReqs, ErrPartnerNotSupp, ErrPartnerNoAuth, ErrUnionNotSupp:
		// A copy the server will not do: the caller falls back to
		// reading and writing, as Linux's nfs42_proc_copy does.
		return syscall.EOPNOTSUPP
	case ErrWrongLFS, ErrBadLabel:
		return syscall.EINVAL
	case ErrNoXattr:
		return syscall.ENODATA
	case ErrXattr2Big:
		return syscall.E2BIG
	case ErrTooSmall:
		return syscall.EINVAL
	case ErrDelay, ErrGrace:
		return syscall.EAGAIN
	case ErrDenied, ErrLocked, ErrShareDenied, ErrFileOpen:
		return syscall.EACCES
	case ErrDeadlock:
		return syscall.EDEADLK
	case ErrBadName:
		return syscall.EINVAL
	case ErrSymlink:
		return syscall.ELOOP
	case ErrOpenMode:
		return syscall.EBADF
	case ErrBadCookie, ErrNotSame, ErrSame:
		return syscall.EINVAL
	}
	return syscall.EIO
}

// ErrProtocol reports a reply the client cannot make sense of: a
// malformed COMPOUND, results that do not match the request, impossible
// lengths. It wraps the decoding error.
var ErrProtocol = errors.New("nfs: protocol error")

// OpError is a failed operation inside a COMPOUND.
type OpError struct {
	Op     string // e.g. "LOOKUP"
	Status Status
}

func (e *OpError) Error() string { return fmt.Sprintf("nfs: %s: %v", e.Op, e.Status) }

// Unwrap returns the Status, so errors.Is(err, nfsclient.ErrNoEnt) works.
func (e *OpError) Unwrap() error { return e.Status }

// Errno returns the error number of a Status, OpError or transport error,
// for the FUSE layer: ENOENT and friends for NFS errors, ETIMEDOUT for a
// soft mount's timeout, EIO otherwise.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var st Status
	if errors.As(err, &st) {
		return st.Errno()
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	if errors.Is(err, errTimeout) {
		return syscall.ETIMEDOUT
	}
	if errors.Is(err, ErrNoCredentials) {
		return syscall.EACCES
	}
	return syscall.EIO
}
