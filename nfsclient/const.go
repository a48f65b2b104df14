package nfsclient

// NFSv4 program and COMPOUND procedure (RFC 8881 s16).
const (
	nfsProgram    = 100003
	nfsVersion    = 4
	procNull      = 0
	procCompound  = 1
	minorVersion1 = 1
	minorVersion2 = 2

	// cbProgram is the callback program number we register in
	// CREATE_SESSION (any value is allowed: RFC 8881 s18.36.3).
	cbProgram = 0x40000000
)

func opName(op uint32) string {
	if s, ok := opSpecOf(op); ok {
		return s.name
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
