package nfsclient

// NFSv4 program and COMPOUND procedure (RFC 8881 s16).
const (
	nfsProgram    = 100003
	nfsVersion    = 4
	procNull      = 0
	procCompound  = 1
	minorVersion1 = 1

	// cbProgram is the callback program number we register in
	// CREATE_SESSION (any value is allowed: RFC 8881 s18.36.3).
	cbProgram = 0x40000000
)

// Operation numbers (RFC 8881 s16.2.1, nfs_opnum4).
const (
	opAccess            = 3
	opClose             = 4
	opCommit            = 5
	opCreate            = 6
	opDelegReturn       = 8
	opGetAttr           = 9
	opGetFH             = 10
	opLink              = 11
	opLock              = 12
	opLockT             = 13
	opLockU             = 14
	opLookup            = 15
	opLookupP           = 16
	opOpen              = 18
	opPutFH             = 22
	opPutRootFH         = 24
	opRead              = 25
	opReadDir           = 26
	opReadLink          = 27
	opRemove            = 28
	opRename            = 29
	opRestoreFH         = 31
	opSaveFH            = 32
	opSetAttr           = 34
	opWrite             = 38
	opBindConnToSession = 41
	opExchangeID        = 42
	opCreateSession     = 43
	opDestroySession    = 44
	opSecInfoNoName     = 52
	opSequence          = 53
	opDestroyClientID   = 57
	opReclaimComplete   = 58
	opIllegal           = 10044
)

var opNames = map[uint32]string{
	opAccess: "ACCESS", opClose: "CLOSE", opCommit: "COMMIT", opCreate: "CREATE",
	opDelegReturn: "DELEGRETURN", opGetAttr: "GETATTR", opGetFH: "GETFH", opLink: "LINK",
	opLock: "LOCK", opLockT: "LOCKT", opLockU: "LOCKU",
	opLookup: "LOOKUP", opLookupP: "LOOKUPP", opOpen: "OPEN", opPutFH: "PUTFH",
	opPutRootFH: "PUTROOTFH", opRead: "READ", opReadDir: "READDIR", opReadLink: "READLINK",
	opRemove: "REMOVE", opRename: "RENAME", opRestoreFH: "RESTOREFH", opSaveFH: "SAVEFH",
	opSetAttr: "SETATTR", opWrite: "WRITE", opBindConnToSession: "BIND_CONN_TO_SESSION",
	opExchangeID: "EXCHANGE_ID", opCreateSession: "CREATE_SESSION",
	opDestroySession: "DESTROY_SESSION", opSecInfoNoName: "SECINFO_NO_NAME",
	opSequence: "SEQUENCE", opDestroyClientID: "DESTROY_CLIENTID",
	opReclaimComplete: "RECLAIM_COMPLETE", opIllegal: "ILLEGAL",
}

func opName(op uint32) string {
	if n, ok := opNames[op]; ok {
		return n
	}
	return "OP_" + itoa(op)
}

func itoa(v uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// File types (RFC 8881 s3.3.4, nfs_ftype4).
type FileType uint32

// File types.
const (
	TypeReg       FileType = 1
	TypeDir       FileType = 2
	TypeBlk       FileType = 3
	TypeChr       FileType = 4
	TypeLnk       FileType = 5
	TypeSock      FileType = 6
	TypeFifo      FileType = 7
	TypeAttrDir   FileType = 8
	TypeNamedAttr FileType = 9
)

// ACCESS bits (RFC 8881 s18.1).
const (
	AccessRead    = 0x01
	AccessLookup  = 0x02
	AccessModify  = 0x04
	AccessExtend  = 0x08
	AccessDelete  = 0x10
	AccessExecute = 0x20
)

// OPEN share access and deny (RFC 8881 s18.16.3).
const (
	ShareAccessRead  = 1
	ShareAccessWrite = 2
	ShareAccessBoth  = 3
	ShareDenyNone    = 0
	ShareDenyRead    = 1
	ShareDenyWrite   = 2
	ShareDenyBoth    = 3

	// shareAccessWantNoDeleg asks the server not to hand out a delegation
	// (RFC 8881 s18.16.3, OPEN4_SHARE_ACCESS_WANT_NO_DELEG).
	shareAccessWantNoDeleg = 0x0400
)

// CreateMode selects how OPEN creates a file (RFC 8881 s18.16, createmode4).
type CreateMode uint32

// Create modes. NoCreate opens an existing file.
const (
	Unchecked   CreateMode = 0
	Guarded     CreateMode = 1
	Exclusive   CreateMode = 2
	Exclusive41 CreateMode = 3
	NoCreate    CreateMode = 0xffffffff
)

// Stable is the stable_how4 of a WRITE (RFC 8881 s18.32).
type Stable uint32

// WRITE stability levels.
const (
	Unstable Stable = 0
	DataSync Stable = 1
	FileSync Stable = 2
)

// EXCHANGE_ID and CREATE_SESSION flags.
const (
	exchgidFlagUseNonPNFS    = 0x00010000
	exchgidFlagConfirmedR    = 0x80000000
	createSessionPersist     = 0x01
	createSessionConnBackCh  = 0x02
	sp4None                  = 0
	cdfc4ForeOrBoth          = 3
	openClaimNull            = 0
	openClaimFH              = 4
	open4NoCreate            = 0
	open4Create              = 1
	openDelegateNone         = 0
	openDelegateRead         = 1
	openDelegateWrite        = 2
	openDelegateNoneExt      = 3
	open4ResultLockTypePosix = 0x4
)

// SEQUENCE status flags (RFC 8881 s18.46.3) that the client acts on.
const (
	seq4StatusCBPathDown          = 0x00000001
	seq4StatusExpiredAllState     = 0x00000010
	seq4StatusRestartReclaimNeed  = 0x00000100
	seq4StatusCBPathDownSession   = 0x00000200
	seq4StatusBackchannelFault    = 0x00000400
	seq4StatusAdminStateRevoked   = 0x00000020
	seq4StatusRecallableStateRevk = 0x00000040
)
