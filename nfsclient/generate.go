package nfsclient

// The protocol's types and operations are described once, in nfs4.x;
// xdrgen writes their codecs (nfs4_xdr.go) and a fuzz target for the
// decoders (nfs4_xdr_gen_test.go). TestGeneratedUpToDate checks that
// both match the description.

//go:generate go run ./internal/xdrgen/xdrgen -in nfs4.x -out nfs4_xdr.go -test nfs4_xdr_gen_test.go
