// Command xdrgen writes nfsclient's generated codecs (go generate).
//
//	xdrgen -in nfs4.x -out nfs4_xdr.go -test nfs4_xdr_gen_test.go
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdmafs/rdmafs/nfsclient/internal/xdrgen"
)

func main() {
	in := flag.String("in", "nfs4.x", "XDR description")
	out := flag.String("out", "nfs4_xdr.go", "generated codecs")
	test := flag.String("test", "nfs4_xdr_gen_test.go", "generated fuzz target")
	pkg := flag.String("pkg", "nfsclient", "Go package name")
	flag.Parse()
	if err := run(*in, *out, *test, *pkg); err != nil {
		fmt.Fprintln(os.Stderr, "xdrgen:", err)
		os.Exit(1)
	}
}

func run(in, out, test, pkg string) error {
	src, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	code, tcode, err := xdrgen.Generate(src, pkg, filepath.Base(in))
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := os.WriteFile(out, code, 0o644); err != nil {
		return err
	}
	return os.WriteFile(test, tcode, 0o644)
}
