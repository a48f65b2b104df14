package nfsclient

import (
	"testing"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

func TestMain(m *testing.M) { testpeer.Main(m) }
