module github.com/rdmafs/rdmafs

go 1.26.8

require (
	github.com/cpuguy83/go-md2man/v2 v2.0.7
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/jcmturner/gokrb5/v8 v8.4.4
	github.com/urfave/cli/v2 v2.27.7
	golang.org/x/sys v0.49.0
)

require (
	github.com/hashicorp/go-uuid v1.0.3 // indirect
	github.com/jcmturner/aescts/v2 v2.0.0 // indirect
	github.com/jcmturner/dnsutils/v2 v2.0.0 // indirect
	github.com/jcmturner/gofork v1.7.6 // indirect
	github.com/jcmturner/rpc/v2 v2.0.3 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	golang.org/x/crypto v0.6.0 // indirect
	golang.org/x/net v0.7.0 // indirect
)
