package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/urfave/cli/v2"
)

// manCommand is the hidden "rdmafs man", which writes the rdmafs(8)
// manual page; make man and make install run it.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:      "man",
		Hidden:    true,
		Usage:     "write the rdmafs(8) manual page (roff) to stdout or --output",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"O"}, Usage: "write the page to `FILE`", DefaultText: "stdout"},
		},
		Action: func(cctx *cli.Context) error {
			page := manPage(cctx.App)
			if out := cctx.String("output"); out != "" {
				if err := os.WriteFile(out, page, 0o644); err != nil {
					return exitf(exitFailure, err, "man page: %v", err)
				}
				return nil
			}
			_, err := os.Stdout.Write(page)
			return err
		},
	}
}

// manPage renders the manual page of app from its definitions: the
// description, and each visible command with its usage, description and
// visible flags. Hidden commands and flags stay out of it, as they stay
// out of --help.
//
// urfave/cli's own ToMan leaves out the commands' descriptions, which
// hold the mount options, exit codes and files, so the page is written
// here as markdown and rendered to roff by go-md2man as ToMan does. The
// help texts are plain text laid out in columns: they go in as indented
// (literal) blocks, which md2man keeps verbatim.
func manPage(app *cli.App) []byte {
	var md bytes.Buffer
	fmt.Fprintf(&md, "%% %s 8\n\n", strings.ToUpper(app.Name))
	fmt.Fprintf(&md, "# NAME\n\n%s - %s\n\n", app.Name, mdEscape(app.Usage))
	md.WriteString("# SYNOPSIS\n\n")
	for _, c := range app.VisibleCommands() {
		fmt.Fprintf(&md, "**%s %s** [*options*] %s\n\n", app.Name, c.Name, mdEscape(c.ArgsUsage))
	}
	if app.Description != "" {
		md.WriteString("# DESCRIPTION\n\n")
		md.WriteString(literal(app.Description))
	}
	md.WriteString("# COMMANDS\n\n")
	for _, c := range app.VisibleCommands() {
		fmt.Fprintf(&md, "## %s %s\n\n", app.Name, c.Name)
		if c.Usage != "" {
			fmt.Fprintf(&md, "%s\n\n", mdEscape(c.Usage))
		}
		usage := c.UsageText
		if usage == "" {
			usage = fmt.Sprintf("%s %s [options] %s", app.Name, c.Name, c.ArgsUsage)
		}
		md.WriteString(literal(usage))
		if c.Description != "" {
			md.WriteString(literal(c.Description))
		}
		if flags := c.VisibleFlags(); len(flags) > 0 {
			fmt.Fprintf(&md, "### Options of %s %s\n\n", app.Name, c.Name)
			for _, f := range flags {
				md.WriteString(manFlag(f))
			}
		}
	}
	md.WriteString("# SEE ALSO\n\n")
	md.WriteString("**nfs**(5), **mount**(8), **umount**(8), **fusermount3**(1), **fstab**(5)\n")
	return md2man.Render(md.Bytes())
}

// manFlag describes one flag as a markdown paragraph: its names (each
// spelled as on the command line), its value, its usage and default.
func manFlag(f cli.Flag) string {
	df, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return ""
	}
	placeholder, usage := unquoteUsage(df.GetUsage())
	var names []string
	for _, n := range f.Names() {
		dash := "--"
		if len(n) == 1 {
			dash = "-"
		}
		name := "**" + mdEscape(dash+n) + "**"
		if df.TakesValue() {
			if placeholder == "" {
				placeholder = "value"
			}
			name += " *" + mdEscape(placeholder) + "*"
		}
		names = append(names, name)
	}
	text := mdEscape(usage)
	if d := df.GetDefaultText(); d != "" {
		text += " (default: " + mdEscape(d) + ")"
	} else if df.TakesValue() && df.GetValue() != "" {
		text += " (default: " + mdEscape(df.GetValue()) + ")"
	}
	return strings.Join(names, ", ") + "\n: " + text + "\n\n"
}

// literal makes text an indented markdown code block, kept verbatim.
func literal(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.Trim(text, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString("    " + line + "\n")
	}
	return b.String() + "\n"
}

// mdEscape escapes the characters markdown would take for markup.
func mdEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune("\\`*_{}[]<>()#+-.!|~", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// unquoteUsage returns a flag usage's placeholder, the word it quotes in
// back quotes (urfave/cli's convention), and the usage without the quotes.
func unquoteUsage(usage string) (placeholder, text string) {
	i := strings.IndexByte(usage, '`')
	if i < 0 {
		return "", usage
	}
	j := strings.IndexByte(usage[i+1:], '`')
	if j < 0 {
		return "", usage
	}
	name := usage[i+1 : i+1+j]
	return name, usage[:i] + name + usage[i+1+j+1:]
}
