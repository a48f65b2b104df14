package nfs_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// exampleEnv names the variable the examples read the export from, as a
// program would: "server:port:/export".
const exampleEnv = "NFS_EXPORT"

// TestMain starts the ganesha the examples talk to (they cannot call
// RequireGanesha) and puts its export in $NFS_EXPORT. In -short mode,
// where the integration tests skip, the examples are skipped too.
func TestMain(m *testing.M) {
	flag.Parse()
	run := flag.Lookup("test.run").Value.String()
	switch {
	case testing.Short():
		if flag.Lookup("test.skip").Value.String() == "" {
			flag.Set("test.skip", "^Example")
		}
	case run == "" || strings.Contains(run, "Example"):
		g, err := testpeer.SharedGanesha()
		if err != nil {
			// The examples fail, printing the dial error.
			fmt.Fprintf(os.Stderr, "examples: cannot start ganesha: %v\n", err)
			break
		}
		os.Setenv(exampleEnv, g.Addr+":"+g.Export)
	}
	testpeer.Main(m)
}
