package oncrpc

import (
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Authentication flavors (RFC 5531 s8.2).
const (
	FlavorNone = 0
	FlavorSys  = 1
)

// Credential is an opaque_auth: a flavor and its encoded body; or, for
// RPCSEC_GSS, the context a call is made under, whose credential and
// verifier are written each time the call is sent.
type Credential struct {
	Flavor uint32
	Body   []byte
	// GSS is the RPCSEC_GSS context (GSSContext.Credential); Body is then
	// unused.
	GSS *GSSContext
}

// AuthNone is the AUTH_NONE credential.
var AuthNone = Credential{Flavor: FlavorNone}

func (c Credential) encode(e *xdr.Encoder) {
	e.Uint32(c.Flavor)
	e.Opaque(c.Body)
}

// AuthSys is an AUTH_SYS credential body (RFC 5531 appendix A).
type AuthSys struct {
	Stamp       uint32
	MachineName string // at most 255 bytes
	UID, GID    uint32
	GIDs        []uint32 // supplementary groups, at most 16
}

// maxAuthSysGroups is the limit on supplementary groups (RFC 5531 app. A).
const maxAuthSysGroups = 16

// Credential encodes a as an AUTH_SYS credential. Groups beyond the
// sixteen the protocol allows are dropped, as the Linux client does.
func (a AuthSys) Credential() Credential {
	var e xdr.Encoder
	e.Uint32(a.Stamp)
	name := a.MachineName
	if len(name) > 255 {
		name = name[:255]
	}
	e.String(name)
	e.Uint32(a.UID)
	e.Uint32(a.GID)
	gids := a.GIDs
	if len(gids) > maxAuthSysGroups {
		gids = gids[:maxAuthSysGroups]
	}
	e.Uint32(uint32(len(gids)))
	for _, g := range gids {
		e.Uint32(g)
	}
	return Credential{Flavor: FlavorSys, Body: e.Bytes()}
}

// ParseAuthSys decodes an AUTH_SYS credential body.
func ParseAuthSys(body []byte) (AuthSys, error) {
	a, _, err := decodeAuthSys(body)
	return a, err
}

// decodeAuthSys decodes an AUTH_SYS credential body and says how many
// bytes follow its last field.
func decodeAuthSys(body []byte) (AuthSys, int, error) {
	var a AuthSys
	d := xdr.NewDecoder(body)
	a.Stamp = d.Uint32()
	a.MachineName = d.String(255)
	a.UID, a.GID = d.Uint32(), d.Uint32()
	n := d.Length(maxAuthSysGroups)
	for range n {
		a.GIDs = append(a.GIDs, d.Uint32())
	}
	if err := d.Err(); err != nil {
		return AuthSys{}, 0, fmt.Errorf("rpc: bad AUTH_SYS body: %w", err)
	}
	return a, d.Remaining(), nil
}
