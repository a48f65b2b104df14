package oncrpc

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// sysCall is an NFS COMPOUND call with cred and the argument bytes args.
func sysCall(cred Credential, args []byte) []byte {
	var e xdr.Encoder
	AppendCallHeader(&e, 0x1234, 100003, 4, 1, cred)
	return append(e.Bytes(), args...)
}

var anon = Squash{AnonUID: 65534, AnonGID: 65533}

func TestSquashMapCall(t *testing.T) {
	args := []byte{0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef}
	root := AuthSys{Stamp: 7, MachineName: "client", UID: 0, GID: 0, GIDs: []uint32{0, 10, 0}}
	user := AuthSys{Stamp: 7, MachineName: "client", UID: 1000, GID: 100, GIDs: []uint32{10, 20}}
	for _, c := range []struct {
		name string
		m    Squash
		in   AuthSys
		want AuthSys
	}{
		{"root_squash root", Squash{Root: true, AnonUID: 65534, AnonGID: 65533}, root,
			AuthSys{Stamp: 7, MachineName: "client", UID: 65534, GID: 65533, GIDs: []uint32{65533, 10, 65533}}},
		{"root_squash user", Squash{Root: true, AnonUID: 65534, AnonGID: 65533}, user, user},
		{"all_squash user", Squash{All: true, AnonUID: 65534, AnonGID: 65533}, user,
			AuthSys{Stamp: 7, MachineName: "client", UID: 65534, GID: 65533}},
		{"no_root_squash root", anon, root, root},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := sysCall(c.in.Credential(), args)
			out, reply, err := c.m.MapCall(in)
			if err != nil || reply != nil {
				t.Fatalf("MapCall: reply %x, err %v", reply, err)
			}
			h, rest, err := ParseCall(out)
			if err != nil {
				t.Fatalf("mapped call does not parse: %v\n%x", err, out)
			}
			if h.XID != 0x1234 || h.Prog != 100003 || h.Proc != 1 || h.Cred.Flavor != FlavorSys {
				t.Errorf("header changed: %+v", h)
			}
			got, err := ParseAuthSys(h.Cred.Body)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) && !(len(got.GIDs) == 0 && len(c.want.GIDs) == 0 && got.UID == c.want.UID && got.GID == c.want.GID) {
				t.Errorf("credential %+v, want %+v", got, c.want)
			}
			if !bytes.Equal(rest, args) {
				t.Errorf("arguments %x, want %x", rest, args)
			}
		})
	}
}

// TestSquashFlavors: AUTH_NONE and RPCSEC_GSS pass byte for byte, other
// flavors and broken AUTH_SYS bodies get AUTH_BADCRED, a non-call is an
// error, RPC version 3 gets RPC_MISMATCH 2..2.
func TestSquashFlavors(t *testing.T) {
	m := Squash{All: true, AnonUID: 1, AnonGID: 1}
	for _, fl := range []uint32{FlavorNone, FlavorGSS} {
		in := sysCall(Credential{Flavor: fl, Body: []byte{1, 2, 3, 4}}, []byte{9, 9, 9, 9})
		out, reply, err := m.MapCall(in)
		if err != nil || reply != nil || !bytes.Equal(out, in) {
			t.Errorf("flavor %d: out %x reply %x err %v, want the call unchanged", fl, out, reply, err)
		}
	}
	// The denied reply: xid, REPLY, MSG_DENIED, AUTH_ERROR, AUTH_BADCRED.
	badcred, _ := hex.DecodeString("00001234" + "00000001" + "00000001" + "00000001" + "00000001")
	truncated := AuthSys{MachineName: "x", GIDs: []uint32{1}}.Credential()
	truncated.Body = truncated.Body[:len(truncated.Body)-4]
	trailing := AuthSys{MachineName: "x"}.Credential()
	trailing.Body = append(trailing.Body, 0, 0, 0, 0)
	for name, cred := range map[string]Credential{
		"AUTH_DH":           {Flavor: 3, Body: []byte{0, 0, 0, 0}},
		"AUTH_TLS":          {Flavor: 7},
		"truncated":         {Flavor: FlavorSys, Body: truncated.Body},
		"trailing":          {Flavor: FlavorSys, Body: trailing.Body},
		"seventeen groups":  {Flavor: FlavorSys, Body: append(AuthSys{}.Credential().Body[:16], 0, 0, 0, 17)},
		"oversized opaque":  {Flavor: FlavorSys, Body: make([]byte, 404)},
		"empty AUTH_SYS":    {Flavor: FlavorSys},
		"name over 255 len": {Flavor: FlavorSys, Body: append([]byte{0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 268)...)},
	} {
		out, reply, err := m.MapCall(sysCall(cred, nil))
		if err != nil || out != nil || !bytes.Equal(reply, badcred) {
			t.Errorf("%s: out %x reply %x err %v, want AUTH_BADCRED %x", name, out, reply, err, badcred)
		}
	}
	in := sysCall(AuthNone, nil)
	in[8+3] = 3 // rpcvers 3
	mismatch, _ := hex.DecodeString("00001234" + "00000001" + "00000001" + "00000000" + "00000002" + "00000002")
	if _, reply, err := m.MapCall(in); err != nil || !bytes.Equal(reply, mismatch) {
		t.Errorf("RPC version 3: reply %x err %v, want RPC_MISMATCH %x", reply, err, mismatch)
	}
	in = sysCall(AuthNone, nil)
	in[7] = MsgReply
	if _, _, err := m.MapCall(in); !errors.Is(err, ErrMalformedCall) {
		t.Errorf("a reply: err %v, want ErrMalformedCall", err)
	}
	if _, _, err := m.MapCall(in[:20]); !errors.Is(err, ErrMalformedCall) {
		t.Errorf("20 bytes: err %v, want ErrMalformedCall", err)
	}
}

// FuzzSquashMapCall: any message maps without a panic; a mapped AUTH_SYS
// call parses, keeps its header and arguments, and carries no id the
// mapping should have replaced.
func FuzzSquashMapCall(f *testing.F) {
	f.Add(sysCall(AuthSys{MachineName: "m", GIDs: []uint32{0, 5}}.Credential(), []byte{1, 2, 3, 4}), false)
	f.Add(sysCall(AuthSys{UID: 5, GID: 6}.Credential(), nil), true)
	f.Add(sysCall(Credential{Flavor: FlavorGSS, Body: []byte{1, 2, 3, 4}}, nil), true)
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2}, false)
	f.Fuzz(func(t *testing.T, msg []byte, all bool) {
		m := Squash{All: all, Root: true, AnonUID: 65534, AnonGID: 65534}
		out, reply, err := m.MapCall(msg)
		if err != nil || reply != nil || len(msg) < callCredOff+8 || msg[callCredOff+3] != FlavorSys {
			return
		}
		if _, _, err := ParseCall(msg); err != nil {
			return // a broken verifier: forwarded as it is, for the server to refuse
		}
		h, rest, err := ParseCall(out)
		if err != nil {
			t.Fatalf("mapped call does not parse: %v", err)
		}
		a, err := ParseAuthSys(h.Cred.Body)
		if err != nil {
			t.Fatalf("mapped credential does not parse: %v", err)
		}
		if a.UID == 0 || a.GID == 0 || (all && (a.UID != 65534 || len(a.GIDs) != 0)) {
			t.Fatalf("mapped credential %+v", a)
		}
		for _, g := range a.GIDs {
			if g == 0 {
				t.Fatalf("gid 0 left in %+v", a)
			}
		}
		if !bytes.Equal(out[:callCredOff], msg[:callCredOff]) || !bytes.HasSuffix(msg, rest) {
			t.Fatal("header or arguments changed")
		}
	})
}
