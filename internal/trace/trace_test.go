package trace

import (
	"bytes"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	c, err := Parse("nfs,RPC")
	if err != nil || c != NFS|RPC {
		t.Fatalf("Parse = %v, %v", c, err)
	}
	if c, _ := Parse("all"); c != All {
		t.Fatalf("all = %v", c)
	}
	if _, err := Parse("nfs,bogus"); err == nil {
		t.Fatal("bogus category accepted")
	}
}

func TestPrintf(t *testing.T) {
	var b bytes.Buffer
	tr := New(&b, NFS)
	tr.Printf(NFS, "xid=%#x", 5)
	tr.Printf(RPC, "hidden")
	if !strings.HasSuffix(b.String(), " nfs xid=0x5\n") || strings.Contains(b.String(), "hidden") {
		t.Fatalf("output %q", b.String())
	}
	var nilTracer *Tracer
	nilTracer.Printf(NFS, "no panic")
}
