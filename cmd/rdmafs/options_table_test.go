package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestOptionTable checks the option table: every name is set by one
// entry only and not also a mount(8) or ignored option, every entry has
// help, and rdmafs mount --help describes every name.
func TestOptionTable(t *testing.T) {
	help := helpText(t, "mount", "--help")
	desc := help[strings.Index(help, "MOUNT OPTIONS"):strings.Index(help, "\nOPTIONS:")]
	seen := map[string]bool{}
	for _, mo := range mountOptionTable {
		if mo.help == "" || mo.set == nil {
			t.Errorf("option %v: no help or no set function", mo.names)
		}
		for _, name := range mo.names {
			if seen[name] {
				t.Errorf("option %s: in the table twice", name)
			}
			seen[name] = true
			if _, ok := vfsOptions[name]; ok || ignoredOptions[name] {
				t.Errorf("option %s: in the table and among the mount(8) or ignored options", name)
			}
			if !regexp.MustCompile(`\b` + name + `\b`).MatchString(desc) {
				t.Errorf("option %s is not described under MOUNT OPTIONS of rdmafs mount --help", name)
			}
		}
	}
}

// TestOptionEdges pins behaviour of the option parser that its table
// keeps from the switch it replaced.
func TestOptionEdges(t *testing.T) {
	o := defaultOptions()
	if err := o.set("noac"); err != nil || !o.NoAC {
		t.Fatalf("noac: %v", err)
	}
	if err := o.set("ac=1"); err != nil || o.NoAC {
		t.Errorf("ac=1: %v NoAC=%v: ac ignores a value", err, o.NoAC)
	}
	if err := o.set("retrans=-1"); err == nil || o.Retrans != defaultOptions().Retrans {
		t.Errorf("retrans=-1: %v, retrans %d: a bad value changes nothing", err, o.Retrans)
	}
	for opt, want := range map[string]string{
		"proto":       "option proto=: want",
		"uring=maybe": "option uring=maybe: want on, auto or off",
		"nconnect":    "option nconnect=: want 1 to",
		"rdmamem=3M":  "want 4M to 64G",
		"nouring=on":  "takes no value",
	} {
		if err := o.set(opt); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", opt, err, want)
		}
	}
}
