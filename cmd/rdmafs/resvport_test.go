package main

import (
	"os"
	"strings"
	"testing"
)

// TestResvPortOption: as root a mount binds a reserved port unless
// noresvport says otherwise (nfs(5)), the last of the two options wins,
// and noresvport shows in the options as /proc/mounts shows it.
func TestResvPortOption(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the default of resvport is root's; run the tests as root")
	}
	for _, c := range []struct {
		list string
		resv bool
	}{{"", true}, {"noresvport", false}, {"resvport", true}, {"resvport,noresvport", false}, {"noresvport,resvport", true}} {
		o := defaultOptions()
		o.Server = "s"
		if c.list != "" {
			if err := o.parseOptionList(c.list); err != nil {
				t.Fatalf("%s: %v", c.list, err)
			}
		}
		if o.resvPort() != c.resv || strings.Contains(o.String(), ",noresvport") == c.resv || dialConfig(&o, nil).ResvPort != c.resv {
			t.Errorf("%q: resvport %v, options %s; want resvport %v", c.list, o.resvPort(), o.String(), c.resv)
		}
	}
	o := defaultOptions()
	if err := o.set("resvport=1"); err == nil {
		t.Error("resvport=1 accepted: the option takes no value")
	}
}
