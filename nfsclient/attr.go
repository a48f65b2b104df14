package nfsclient

import (
	"fmt"
	"strconv"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Attribute numbers (RFC 8881 s5.8, fattr4_*).
const (
	attrSupportedAttrs  = 0
	attrType            = 1
	attrFHExpireType    = 2
	attrChange          = 3
	attrSize            = 4
	attrLinkSupport     = 5
	attrSymlinkSupport  = 6
	attrNamedAttr       = 7
	attrFSID            = 8
	attrUniqueHandles   = 9
	attrLeaseTime       = 10
	attrRdattrError     = 11
	attrACLSupport      = 13
	attrArchive         = 14
	attrCanSetTime      = 15
	attrCaseInsensitive = 16
	attrCasePreserving  = 17
	attrChownRestricted = 18
	attrFileHandle      = 19
	attrFileID          = 20
	attrFilesAvail      = 21
	attrFilesFree       = 22
	attrFilesTotal      = 23
	attrHidden          = 25
	attrHomogeneous     = 26
	attrMaxFileSize     = 27
	attrMaxLink         = 28
	attrMaxName         = 29
	attrMaxRead         = 30
	attrMaxWrite        = 31
	attrMode            = 33
	attrNoTrunc         = 34
	attrNumLinks        = 35
	attrOwner           = 36
	attrOwnerGroup      = 37
	attrQuotaAvailHard  = 38
	attrQuotaAvailSoft  = 39
	attrQuotaUsed       = 40
	attrRawDev          = 41
	attrSpaceAvail      = 42
	attrSpaceFree       = 43
	attrSpaceTotal      = 44
	attrSpaceUsed       = 45
	attrSystem          = 46
	attrTimeAccess      = 47
	attrTimeAccessSet   = 48
	attrTimeBackup      = 49
	attrTimeCreate      = 50
	attrTimeDelta       = 51
	attrTimeMetadata    = 52
	attrTimeModify      = 53
	attrTimeModifySet   = 54
	attrMountedOnFileID = 55
)

// Bitmap is an attribute bitmap4 (RFC 8881 s3.3.7): bit N of word N/32.
type Bitmap [3]uint32

// maxBitmapWords bounds a decoded bitmap4; words past our three must be 0.
const maxBitmapWords = 8

func bitmapOf(attrs ...int) Bitmap {
	var b Bitmap
	for _, a := range attrs {
		b[a/32] |= 1 << (a % 32)
	}
	return b
}

// Has reports whether attribute n is in the bitmap.
func (b Bitmap) Has(n int) bool { return n/32 < len(b) && b[n/32]&(1<<(n%32)) != 0 }

func (b Bitmap) encode(e *xdr.Encoder) {
	n := len(b)
	for n > 0 && b[n-1] == 0 {
		n--
	}
	e.Uint32(uint32(n))
	for _, w := range b[:n] {
		e.Uint32(w)
	}
}

func (b *Bitmap) decode(d *xdr.Decoder) { *b = decodeBitmap(d) }

func decodeBitmap(d *xdr.Decoder) Bitmap {
	var b Bitmap
	n := d.Length(maxBitmapWords)
	for i := range n {
		w := d.Uint32()
		if i < len(b) {
			b[i] = w
		} else if w != 0 {
			d.SetErr(fmt.Errorf("attribute bitmap word %d = %#x: attribute unknown to this client", i, w))
		}
	}
	return b
}

// Attrs requested by GETATTR for a file (what stat(2) needs).
var fileAttrs = bitmapOf(attrType, attrChange, attrSize, attrFSID, attrFileID, attrMode,
	attrNumLinks, attrOwner, attrOwnerGroup, attrRawDev, attrSpaceUsed, attrTimeAccess,
	attrTimeMetadata, attrTimeModify, attrMountedOnFileID)

// Attrs requested for statfs.
var fsAttrs = bitmapOf(attrFilesAvail, attrFilesFree, attrFilesTotal, attrSpaceAvail,
	attrSpaceFree, attrSpaceTotal, attrMaxName)

// Attrs requested once per mount from the root.
var serverAttrs = bitmapOf(attrSupportedAttrs, attrLeaseTime, attrMaxFileSize, attrMaxRead,
	attrMaxWrite, attrMaxName, attrFHExpireType)

// FSID identifies a file system on the server.
type FSID struct{ Major, Minor uint64 }

// Attr holds the attributes a server returned. Mask says which are valid.
type Attr struct {
	Mask       Bitmap
	Type       FileType
	Change     uint64
	Size       uint64
	FSID       FSID
	FileID     uint64
	Mode       uint32 // permission bits only (07777)
	NLink      uint32
	Owner      string // as the server sent it
	Group      string
	UID, GID   uint32 // Owner and Group mapped to numbers
	RdevMajor  uint32
	RdevMinor  uint32
	SpaceUsed  uint64
	Atime      time.Time
	Ctime      time.Time // time_metadata
	Mtime      time.Time
	MountedOn  uint64
	RdattrErr  Status // READDIR entries: the rdattr_error attribute
	FileHandle []byte

	// File system attributes (statfs, server limits).
	Supported               Bitmap
	LeaseTime               uint32
	FHExpireType            uint32
	FilesAvail, FilesFree   uint64
	FilesTotal              uint64
	SpaceAvail, SpaceFree   uint64
	SpaceTotal              uint64
	MaxFileSize             uint64
	MaxRead, MaxWrite       uint64
	MaxName                 uint32
	MaxLink                 uint32
	LinkSupport, SymSupport bool
}

// maxOwnerLen bounds owner strings: longer than any name a system allows.
const maxOwnerLen = 1024

// maxFHSize is NFS4_FHSIZE (RFC 8881 s3.2).
const maxFHSize = 128

func decodeTime(d *xdr.Decoder) time.Time {
	sec := int64(d.Uint64())
	nsec := d.Uint32()
	if nsec >= 1e9 {
		d.SetErr(fmt.Errorf("nfstime4 nseconds %d out of range", nsec))
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec))
}

func encodeTime(e *xdr.Encoder, t time.Time) {
	e.Uint64(uint64(t.Unix()))
	e.Uint32(uint32(t.Nanosecond()))
}

// decodeFattr decodes a fattr4 (bitmap + attr_vals) into a.
func decodeFattr(d *xdr.Decoder, a *Attr) {
	mask := decodeBitmap(d)
	vals := d.Opaque(1 << 20)
	if d.Err() != nil {
		return
	}
	a.Mask = mask
	vd := xdr.NewDecoder(vals)
	decodeAttrVals(vd, mask, a)
	if err := vd.Err(); err != nil {
		d.SetErr(fmt.Errorf("attributes: %w", err))
		return
	}
	if vd.Remaining() != 0 {
		d.SetErr(fmt.Errorf("attributes: %d bytes left over", vd.Remaining()))
	}
}

func decodeAttrVals(d *xdr.Decoder, mask Bitmap, a *Attr) {
	for n := 0; n < 32*len(mask); n++ {
		if !mask.Has(n) || d.Err() != nil {
			continue
		}
		switch n {
		case attrSupportedAttrs:
			a.Supported = decodeBitmap(d)
		case attrType:
			a.Type = FileType(d.Uint32())
		case attrFHExpireType:
			a.FHExpireType = d.Uint32()
		case attrChange:
			a.Change = d.Uint64()
		case attrSize:
			a.Size = d.Uint64()
		case attrLinkSupport:
			a.LinkSupport = d.Bool()
		case attrSymlinkSupport:
			a.SymSupport = d.Bool()
		case attrNamedAttr, attrUniqueHandles, attrArchive, attrCanSetTime, attrCaseInsensitive,
			attrCasePreserving, attrChownRestricted, attrHidden, attrHomogeneous, attrNoTrunc, attrSystem:
			d.Bool()
		case attrFSID:
			a.FSID.Major, a.FSID.Minor = d.Uint64(), d.Uint64()
		case attrLeaseTime:
			a.LeaseTime = d.Uint32()
		case attrRdattrError:
			a.RdattrErr = Status(d.Uint32())
		case attrACLSupport:
			d.Uint32()
		case attrFileHandle:
			a.FileHandle = append([]byte(nil), d.Opaque(maxFHSize)...)
		case attrFileID:
			a.FileID = d.Uint64()
		case attrFilesAvail:
			a.FilesAvail = d.Uint64()
		case attrFilesFree:
			a.FilesFree = d.Uint64()
		case attrFilesTotal:
			a.FilesTotal = d.Uint64()
		case attrMaxFileSize:
			a.MaxFileSize = d.Uint64()
		case attrMaxLink:
			a.MaxLink = d.Uint32()
		case attrMaxName:
			a.MaxName = d.Uint32()
		case attrMaxRead:
			a.MaxRead = d.Uint64()
		case attrMaxWrite:
			a.MaxWrite = d.Uint64()
		case attrMode:
			a.Mode = d.Uint32() & 07777
		case attrNumLinks:
			a.NLink = d.Uint32()
		case attrOwner:
			a.Owner = d.String(maxOwnerLen)
			a.UID = mapOwner(a.Owner, false)
		case attrOwnerGroup:
			a.Group = d.String(maxOwnerLen)
			a.GID = mapOwner(a.Group, true)
		case attrRawDev:
			a.RdevMajor, a.RdevMinor = d.Uint32(), d.Uint32()
		case attrSpaceAvail:
			a.SpaceAvail = d.Uint64()
		case attrSpaceFree:
			a.SpaceFree = d.Uint64()
		case attrSpaceTotal:
			a.SpaceTotal = d.Uint64()
		case attrSpaceUsed:
			a.SpaceUsed = d.Uint64()
		case attrTimeAccess:
			a.Atime = decodeTime(d)
		case attrTimeMetadata:
			a.Ctime = decodeTime(d)
		case attrTimeModify:
			a.Mtime = decodeTime(d)
		case attrTimeBackup, attrTimeCreate, attrTimeDelta:
			decodeTime(d)
		case attrMountedOnFileID:
			a.MountedOn = d.Uint64()
		case attrQuotaAvailHard, attrQuotaAvailSoft, attrQuotaUsed:
			d.Uint64()
		default:
			d.SetErr(fmt.Errorf("attribute %d was not requested and cannot be decoded", n))
		}
	}
}

// SetAttr lists the attributes a SETATTR (or a create) changes; nil
// fields stay as they are.
type SetAttr struct {
	Mode     *uint32
	UID      *uint32
	GID      *uint32
	Size     *uint64
	Atime    *time.Time
	Mtime    *time.Time
	AtimeNow bool // set atime to the server's time
	MtimeNow bool
}

// Empty reports whether sa changes nothing.
func (sa *SetAttr) Empty() bool {
	return sa == nil || (sa.Mode == nil && sa.UID == nil && sa.GID == nil && sa.Size == nil &&
		sa.Atime == nil && sa.Mtime == nil && !sa.AtimeNow && !sa.MtimeNow)
}

// encode appends sa as a fattr4, in attribute-number order.
func (sa *SetAttr) encode(e *xdr.Encoder) {
	var mask Bitmap
	var v xdr.Encoder
	if sa != nil {
		if sa.Size != nil {
			mask[0] |= 1 << attrSize
			v.Uint64(*sa.Size)
		}
		if sa.Mode != nil {
			mask[1] |= 1 << (attrMode - 32)
			v.Uint32(*sa.Mode & 07777)
		}
		if sa.UID != nil {
			mask[1] |= 1 << (attrOwner - 32)
			v.String(strconv.FormatUint(uint64(*sa.UID), 10))
		}
		if sa.GID != nil {
			mask[1] |= 1 << (attrOwnerGroup - 32)
			v.String(strconv.FormatUint(uint64(*sa.GID), 10))
		}
		encodeSetTime(&v, &mask, attrTimeAccessSet, sa.Atime, sa.AtimeNow)
		encodeSetTime(&v, &mask, attrTimeModifySet, sa.Mtime, sa.MtimeNow)
	}
	mask.encode(e)
	e.Opaque(v.Bytes())
}

// encodeSetTime encodes a settime4 (RFC 8881 s3.3.1, time_how4).
func encodeSetTime(v *xdr.Encoder, mask *Bitmap, attr int, t *time.Time, now bool) {
	if t == nil && !now {
		return
	}
	mask[attr/32] |= 1 << (attr % 32)
	if now {
		v.Uint32(0) // SET_TO_SERVER_TIME4
		return
	}
	v.Uint32(1) // SET_TO_CLIENT_TIME4
	encodeTime(v, *t)
}
