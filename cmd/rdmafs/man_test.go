package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// renderMan formats a roff man page as plain text with groff, failing
// the test on any warning groff gives (-ww: all of them).
func renderMan(t *testing.T, page []byte) string {
	t.Helper()
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Fatalf("groff is needed to check the man page (make deps installs groff-base): %v", err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(groff, "-man", "-Tascii", "-ww", "-P-cbou")
	cmd.Stdin = bytes.NewReader(page)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if err := cmd.Run(); err != nil {
		t.Fatalf("groff: %v\n%s", err, errOut.String())
	}
	if errOut.Len() > 0 {
		t.Fatalf("groff warns about the man page:\n%s", errOut.String())
	}
	return out.String()
}

// TestManPageCoversCLI checks that rdmafs(8), generated from the CLI
// definitions, names every visible command and flag of the App (so a
// command added later is covered without touching this test), shows each
// command's description, leaves hidden ones out, and that groff renders
// it without a warning.
func TestManPageCoversCLI(t *testing.T) {
	app := newApp()
	app.Commands = append(app.Commands, manCommand())
	text := renderMan(t, manPage(app))
	// groff fills paragraphs; compare with runs of blanks made one.
	flat := strings.Join(strings.Fields(text), " ")

	entries := flagEntries(text)
	if len(app.VisibleCommands()) < 3 {
		t.Fatalf("the App has %d visible commands, want mount, umount, stats at least", len(app.VisibleCommands()))
	}
	for _, c := range app.Commands {
		heading := app.Name + " " + c.Name
		if c.Hidden {
			if strings.Contains(text, "\n"+heading+"\n") {
				t.Errorf("hidden command %q has a section in the man page", c.Name)
			}
			continue
		}
		if !strings.Contains(text, "\n"+heading+"\n") {
			t.Errorf("man page has no section %q", heading)
		}
		if c.Description != "" {
			first := strings.Join(strings.Fields(strings.SplitN(strings.TrimSpace(c.Description), "\n", 2)[0]), " ")
			if !strings.Contains(flat, first) {
				t.Errorf("man page lacks the description of %q (%q)", c.Name, first)
			}
		}
		for _, f := range c.Flags {
			for _, n := range f.Names() {
				spelled := "--" + n
				if len(n) == 1 {
					spelled = "-" + n
				}
				visible := true
				if vf, ok := f.(cli.VisibleFlag); ok {
					visible = vf.IsVisible()
				}
				if visible && !entries[spelled] {
					t.Errorf("man page has no entry for %s %s flag %s", app.Name, c.Name, spelled)
				}
				if !visible && strings.Contains(flat, spelled) {
					t.Errorf("man page shows hidden flag %s of %q", spelled, c.Name)
				}
			}
		}
	}
}

// TestManCommandWritesPage runs the hidden "rdmafs man -O FILE" as make
// man does and checks it wrote a section 8 page.
func TestManCommandWritesPage(t *testing.T) {
	app := newApp()
	app.Commands = append(app.Commands, manCommand())
	out := filepath.Join(t.TempDir(), "rdmafs.8")
	if err := app.Run([]string{"rdmafs", "man", "-O", out}); err != nil {
		t.Fatalf("rdmafs man -O %s: %v", out, err)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte(".TH RDMAFS 8\n")) {
		t.Errorf("%s is not a section 8 page; it starts %q", out, page[:min(len(page), 200)])
	}
	if text := renderMan(t, page); !strings.Contains(text, "SEE ALSO") {
		t.Errorf("rendered page lacks SEE ALSO:\n%s", text)
	}
}

// flagEntries returns the flags the rendered page has an entry for: the
// names on the lines that start a flag's entry ("       --foreground, -f").
func flagEntries(text string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "       -") {
			continue
		}
		for _, name := range strings.Split(strings.TrimSpace(line), ", ") {
			names[strings.Fields(name)[0]] = true
		}
	}
	return names
}
