package nfsclient

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/rdmafs/rdmafs/nfsclient/internal/xdrgen"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestGeneratedUpToDate regenerates the codecs from nfs4.x: the checked-in
// files must be what go generate writes.
func TestGeneratedUpToDate(t *testing.T) {
	src, err := os.ReadFile("nfs4.x")
	if err != nil {
		t.Fatal(err)
	}
	code, test, err := xdrgen.Generate(src, "nfsclient", "nfs4.x")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"nfs4_xdr.go": code, "nfs4_xdr_gen_test.go": test} {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what nfs4.x generates: run go generate ./nfsclient", name)
		}
	}
}

// TestOpenNoDelegationReasons decodes OPEN results whose delegation is
// OPEN_DELEGATE_NONE_EXT: only WND4_CONTENTION (1) and WND4_RESOURCE (2)
// carry a flag (RFC 8881 s18.16.2, open_none_delegation4); the GETFH
// after the OPEN must come out whole either way.
func TestOpenNoDelegationReasons(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	openOK := "00000012 00000000 00000001 0a0000000000000000000000 00000000 0000000000000001 0000000000000002 00000004 00000000 00000003"
	getFH := "0000000a 00000000 00000003 aabbcc00"
	for _, tt := range []struct {
		name, why string
		wantErr   error
	}{
		{"not wanted", "00000000", nil},
		{"contention", "00000001 00000001", nil},
		{"resource", "00000002 00000000", nil},
		{"not supported file type", "00000003", nil},
		{"write not supported", "00000004", nil},
		{"contention flag missing", "00000001", ErrProtocol},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cp compound
			cp.reset(rpc, oncrpc.AuthNone, "")
			cp.sequence(testSession, 7, 3, 5)
			cp.putFH([]byte{1})
			open, gfh := &openOp{}, &getFHOp{}
			cp.add(open, gfh)
			var r results
			if err := r.init(&cp, compoundReply(t, 0, "00000004"+seqOK+"00000016 00000000"+openOK+tt.why+getFH)); err != nil {
				t.Fatal(err)
			}
			if st, _, _, err := r.decodeSequence(testSession); err != nil || st != StatusOK {
				t.Fatalf("SEQUENCE: %v %v", st, err)
			}
			err := r.decodeAll(&cp)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if open.res.stateid != (StateID{Seq: 1, Other: [12]byte{10}}) || open.res.rflags != 4 {
				t.Errorf("OPEN result %+v", open.res)
			}
			if !bytes.Equal(gfh.res.object, []byte{0xaa, 0xbb, 0xcc}) {
				t.Errorf("GETFH %x, want aabbcc", gfh.res.object)
			}
		})
	}
}
