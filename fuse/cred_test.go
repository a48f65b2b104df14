package fuse

import (
	"reflect"
	"testing"
)

func TestParseGroups(t *testing.T) {
	status := []byte("Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 24 27 100 \nNgid:\t0\n")
	got, err := parseGroups(status)
	if err != nil || !reflect.DeepEqual(got, []uint32{4, 24, 27, 100}) {
		t.Errorf("got %v, %v", got, err)
	}
	got, err = parseGroups([]byte("Groups:\t\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v", got, err)
	}
	if _, err := parseGroups([]byte("Uid: 0\n")); err == nil {
		t.Error("no Groups line: no error")
	}
}
