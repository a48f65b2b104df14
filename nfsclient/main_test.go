package nfsclient

import (
	"testing"

	"github.com/rdmafs/rdmafs/internal/testpeer"
)

func TestMain(m *testing.M) { testpeer.Main(m) }
