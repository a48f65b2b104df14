package layers

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"testing"
)

// module is the module path; import paths below are relative to it.
const module = "github.com/rdmafs/rdmafs"

// layers places each production package, by path prefix, in a layer. A
// package may import its own layer entry (its sub-packages, or the
// packages under the same prefix) and entries of a lower rank; never an
// entry of its own rank or above it. The longest matching prefix wins,
// so verbs/iwarp sits above verbs. Entries whose packages do not exist
// (yet) match nothing and cost nothing.
var layers = []struct {
	prefix string
	rank   int
	what   string
}{
	{"internal", 0, "XDR primitives, tracing and a bounded LRU cache, shared by every layer"},
	{"oncrpc", 1, "ONC RPC and its transports' interface"},
	{"verbs", 1, "the verbs API"},
	{"verbs/iwarp", 2, "pure-Go iWARP provider"},
	{"verbs/ibverbs", 2, "rdma-core provider"},
	{"mrcache", 2, "registered memory over the verbs API"},
	{"rpcrdma", 3, "RPC-over-RDMA: an oncrpc transport over verbs"},
	{"nfsclient", 3, "NFSv4.1/4.2 over any oncrpc transport"},
	{"nfs", 4, "the Go library: dials a transport, wraps nfsclient"},
	{"fuse", 5, "the FUSE file system over nfsclient"},
	{"cmd/rdmafs", 6, "the command: chooses transports, mounts, relays"},
}

// forbidden are imports the ranks would allow but the design rules out.
var forbidden = []struct {
	from, to string // path prefixes
	why      string
}{
	// The NFSv4 RDMA binding (RFC 8267) reaches rpcrdma as data on each
	// call (RFC 8166 s6: the upper layer binding states which data items
	// are DDP-eligible); nfsclient runs over any oncrpc.Transport.
	{"nfsclient", "verbs", "nfsclient runs over any oncrpc.Transport, not RDMA"},
	{"nfsclient", "mrcache", "nfsclient runs over any oncrpc.Transport, not RDMA"},
	// The mount gets its transport from the command (or the library).
	{"fuse", "verbs", "fuse gets its transport from its caller"},
	{"fuse", "mrcache", "fuse gets its transport from its caller"},
	{"fuse", "rpcrdma", "fuse gets its transport from its caller"},
}

// isLab reports whether pkg is test code: the lab under test/, and the
// conformance and fake-peer packages whose names end in "test"
// (verbs/verbstest, rpcrdma/rpcrdmatest, oncrpc/oncrpctest, ...).
func isLab(pkg string) bool {
	return under(pkg, "test") || strings.HasSuffix(path.Base(pkg), "test")
}

// under reports whether pkg is prefix or inside it, by path elements.
func under(pkg, prefix string) bool {
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

// layerOf returns the index in layers of pkg's entry, or -1.
func layerOf(pkg string) int {
	best := -1
	for i, l := range layers {
		if under(pkg, l.prefix) && (best < 0 || len(l.prefix) > len(layers[best].prefix)) {
			best = i
		}
	}
	return best
}

// importGraph lists the module's packages with their non-test imports
// (go list's Imports leaves out what _test.go files import), relative
// to the module; imports from outside the module are dropped except
// "testing", which production code must not import either.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	goCmd, err := exec.LookPath("go") // go test puts GOROOT/bin first in PATH
	if err != nil {
		t.Fatalf("go command: %v", err)
	}
	cmd := exec.Command(goCmd, "list", "-e", "-f", `{{.ImportPath}} {{join .Imports " "}}{{if .Error}} ERROR:{{.Error}}{{end}}`, module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if i := strings.Index(sc.Text(), " ERROR:"); i >= 0 {
			t.Fatalf("go list: %s", sc.Text()[i+len(" ERROR:"):])
		}
		pkg, ok := strings.CutPrefix(fields[0], module+"/")
		if !ok {
			continue // the module root has no package
		}
		var ours []string
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				ours = append(ours, rel)
			} else if under(imp, "testing") {
				ours = append(ours, imp)
			}
		}
		graph[pkg] = ours
	}
	if len(graph) < 10 {
		t.Fatalf("go list found %d packages of %s; want the whole module:\n%s", len(graph), module, out)
	}
	return graph
}

// violations returns one message per import of graph that breaks the
// layering, naming the importing and the imported package.
func violations(graph map[string][]string) []string {
	var msgs []string
	for pkg, imports := range graph {
		if isLab(pkg) {
			continue // the lab may import anything
		}
		from := layerOf(pkg)
		if from < 0 {
			msgs = append(msgs, fmt.Sprintf("%s is in no layer: add its path prefix to the layers table of test/layers", pkg))
			continue
		}
		for _, imp := range imports {
			if msg := checkImport(pkg, from, imp); msg != "" {
				msgs = append(msgs, msg)
			}
		}
	}
	return msgs
}

// checkImport says what is wrong with pkg (in layers[from]) importing
// imp, or "" if nothing is.
func checkImport(pkg string, from int, imp string) string {
	if under(imp, "testing") {
		return fmt.Sprintf("%s imports %s: production code carries no test hooks", pkg, imp)
	}
	if isLab(imp) {
		return fmt.Sprintf("%s imports the test package %s: production code must not depend on the lab", pkg, imp)
	}
	for _, f := range forbidden {
		if under(pkg, f.from) && under(imp, f.to) {
			return fmt.Sprintf("%s imports %s: %s", pkg, imp, f.why)
		}
	}
	to := layerOf(imp)
	switch {
	case to < 0:
		return fmt.Sprintf("%s imports %s, which is in no layer: add its path prefix to the layers table of test/layers", pkg, imp)
	case to == from:
		return "" // within one entry: a package and its sub-packages
	case layers[to].rank >= layers[from].rank:
		return fmt.Sprintf("%s (layer %d, %s) imports %s (layer %d, %s): a layer imports only layers below it",
			pkg, layers[from].rank, layers[from].prefix, imp, layers[to].rank, layers[to].prefix)
	}
	return ""
}

// TestImportGraph checks the module's real import graph: no production
// package imports a test package or "testing", internal/ imports nothing
// above it, and no layer imports its own rank or one above it.
func TestImportGraph(t *testing.T) {
	graph := importGraph(t)
	for _, must := range []string{"internal/xdr", "oncrpc", "verbs", "rpcrdma", "nfsclient", "fuse", "cmd/rdmafs"} {
		if _, ok := graph[must]; !ok {
			t.Errorf("go list did not report %s", must)
		}
	}
	for _, msg := range violations(graph) {
		t.Error(msg)
	}
}

// TestImportGraphCatches feeds the checker graphs with one bad import
// each, so that a checker that lets everything through fails.
func TestImportGraphCatches(t *testing.T) {
	for _, tc := range []struct{ pkg, imp, want string }{
		{"internal/xdr", "oncrpc", "layer 0"},
		{"oncrpc", "verbs", "layer 1"},
		{"verbs", "oncrpc", "layer 1"},
		{"mrcache", "verbs/iwarp", "layer 2"},
		{"rpcrdma", "nfsclient", "layer 3"},
		{"nfsclient", "rpcrdma", "layer 3"},
		{"nfsclient", "verbs", "not RDMA"},
		{"nfsclient", "mrcache", "not RDMA"},
		{"fuse", "rpcrdma", "its caller"},
		{"fuse", "verbs/ibverbs", "its caller"},
		{"nfs", "fuse", "layer 4"},
		{"fuse", "cmd/rdmafs", "layer 5"},
		{"rpcrdma", "test/testpeer", "lab"},
		{"cmd/rdmafs", "test/testpeer/v2relay", "lab"},
		{"oncrpc", "oncrpc/oncrpctest", "lab"},
		{"rpcrdma", "verbs/verbstest", "lab"},
		{"fuse", "testing", "test hooks"},
		{"nfsclient", "quic", "no layer"},
		{"relay", "oncrpc", "relay is in no layer"},
	} {
		msgs := violations(map[string][]string{tc.pkg: {tc.imp}})
		if len(msgs) != 1 || !strings.Contains(msgs[0], tc.want) {
			t.Errorf("%s importing %s: got %q, want one message with %q", tc.pkg, tc.imp, msgs, tc.want)
		}
	}
	// Allowed: downwards, within an entry, and the lab importing anything.
	ok := map[string][]string{
		"cmd/rdmafs":              {"fuse", "nfs", "rpcrdma", "verbs/iwarp", "internal/trace"},
		"nfs":                     {"nfsclient", "rpcrdma", "verbs/ibverbs", "oncrpc"},
		"fuse":                    {"fuse/uring", "nfsclient", "oncrpc", "internal/trace"},
		"rpcrdma":                 {"mrcache", "verbs", "oncrpc", "internal/xdr"},
		"internal/xdr":            {"internal/trace"},
		"test/testpeer/v2relay":   {"rpcrdma", "test/testpeer"},
		"rpcrdma/rpcrdmatest":     {"rpcrdma", "verbs/verbstest"},
		"nfsclient/internal/xdrg": {"nfsclient/internal/xdrgen"},
	}
	if msgs := violations(ok); len(msgs) > 0 {
		t.Errorf("allowed imports reported: %q", msgs)
	}
}
