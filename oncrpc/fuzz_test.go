package oncrpc

import (
	"bytes"
	"testing"
)

// FuzzParseReply checks that no reply header, however malformed, makes
// the parser panic or return results outside its input.
func FuzzParseReply(f *testing.F) {
	f.Add(mustHex(f, "00000001 00000001 00000000 00000000 00000000 00000000 cafebabe"))
	f.Add(mustHex(f, "00000002 00000001 00000000 00000000 00000000 00000002 00000004 00000004"))
	f.Add(mustHex(f, "00000003 00000001 00000001 00000001 00000005"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		_, res, err := ParseReply(msg)
		if err == nil && len(res) > len(msg) {
			t.Fatal("results longer than message")
		}
		ParseCall(msg)
		ParseAuthSys(msg)
	})
}

// FuzzReadRecord feeds arbitrary byte streams to the record-marking reader.
func FuzzReadRecord(f *testing.F) {
	f.Add(mustHex(f, "80000004 01020304"))
	f.Add(mustHex(f, "00000002 0102 80000002 0304"))
	f.Add(mustHex(f, "ffffffff"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		for {
			msg, err := readRecord(r, 1<<16)
			if err != nil {
				return
			}
			if len(msg.buf) > 1<<16 {
				t.Fatal("record over limit")
			}
		}
	})
}
