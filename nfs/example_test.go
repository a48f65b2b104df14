package nfs_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"syscall"

	"github.com/rdmafs/rdmafs/nfs"
)

// The examples read the export from $NFS_EXPORT, "server:/export" or
// "server:port:/export" (TestMain points it at a test server).

func ExampleDial() {
	ctx := context.Background()
	c, err := nfs.Dial(ctx, os.Getenv("NFS_EXPORT"), nfs.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.WriteFile(ctx, "example-dial.txt", []byte("hello, NFS\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, "example-dial.txt")
	data, err := c.ReadFile(ctx, "example-dial.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(data))
	// Output: hello, NFS
}

func ExampleClient_FS() {
	ctx := context.Background()
	c, err := nfs.Dial(ctx, os.Getenv("NFS_EXPORT"), nfs.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	defer c.RemoveAll(ctx, "example-fs")
	c.MkdirAll(ctx, "example-fs/docs", 0o755)
	c.WriteFile(ctx, "example-fs/docs/a.txt", []byte("a"), 0o644)
	c.WriteFile(ctx, "example-fs/b.txt", []byte("bb"), 0o644)

	// The io/fs view works with fs.WalkDir, fs.Glob, http.FS, template
	// parsing and the like.
	fsys, err := fs.Sub(c.FS(), "example-fs")
	if err != nil {
		log.Fatal(err)
	}
	fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			fmt.Println(name + "/")
			return nil
		}
		info, _ := d.Info()
		fmt.Println(name, info.Size())
		return nil
	})
	matches, _ := fs.Glob(fsys, "*/*.txt")
	fmt.Println(matches)
	// Output:
	// ./
	// b.txt 2
	// docs/
	// docs/a.txt 1
	// [docs/a.txt]
}

func ExampleClient_OpenFile() {
	ctx := context.Background()
	c, err := nfs.Dial(ctx, os.Getenv("NFS_EXPORT"), nfs.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	f, err := c.OpenFile(ctx, "example-open.bin", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, "example-open.bin")
	f.WriteAt([]byte("world"), 6)
	f.WriteAt([]byte("hello,"), 0)
	if err := f.Sync(); err != nil { // COMMIT: stable on the server
		log.Fatal(err)
	}
	buf := make([]byte, 5)
	f.ReadAt(buf, 6)
	info, _ := f.Stat()
	fmt.Printf("%s %d %v\n", buf, info.Size(), info.Mode())
	f.Close()

	// Errors match those of package os.
	_, err = c.OpenFile(ctx, "example-open.bin", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	fmt.Println(errors.Is(err, fs.ErrExist))
	_, err = c.Stat(ctx, "no/such/file")
	fmt.Println(errors.Is(err, fs.ErrNotExist))
	// Output:
	// world 11 -rw-------
	// true
	// true
}

func ExampleFile_Lock() {
	ctx := context.Background()
	c, err := nfs.Dial(ctx, os.Getenv("NFS_EXPORT"), nfs.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	defer c.Remove(ctx, "example-lock")
	c.WriteFile(ctx, "example-lock", []byte("record"), 0o644)

	a, _ := c.OpenFile(ctx, "example-lock", os.O_RDWR, 0)
	defer a.Close()
	b, _ := c.OpenFile(ctx, "example-lock", os.O_RDWR, 0)
	defer b.Close()

	// An exclusive lock on the whole file (length 0: to its end).
	if err := a.Lock(ctx, 0, 0, true, false); err != nil {
		log.Fatal(err)
	}
	err = b.Lock(ctx, 0, 0, true, false) // wait false: fail at once
	fmt.Println("b locked out:", errors.Is(err, syscall.EAGAIN))
	a.Unlock(ctx, 0, 0)
	err = b.Lock(ctx, 0, 0, true, true) // wait true: until ctx ends
	fmt.Println("b locked:", err == nil)
	// Output:
	// b locked out: true
	// b locked: true
}
