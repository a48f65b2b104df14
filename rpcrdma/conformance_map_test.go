package rpcrdma

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestConformanceMap checks CONFORMANCE.md against the project checklist
// (testdata/checklist.md, a copy of the shared specs'): every id appears exactly once, in
// the checklist's numbering; every row has a known status and a reason or
// a test; every test it names exists as a func Test*/Fuzz* in the package
// named; and the summary counts and the list of open ids match the rows.
func TestConformanceMap(t *testing.T) {
	rows := confMapRows(t)
	const checklistItems = 211
	if len(rows) != checklistItems {
		t.Errorf("%d rows, want %d", len(rows), checklistItems)
	}
	seen := map[string]int{}
	counts := map[string]int{}
	var open []string
	cite := regexp.MustCompile("`([a-z0-9/]+)\\.((?:Test|Fuzz)[A-Za-z0-9_]*)`")
	funcs := map[string]map[string]bool{}
	for _, r := range rows {
		seen[r.id]++
		counts[r.status]++
		cited := cite.FindAllStringSubmatch(r.evidence, -1)
		switch r.status {
		case "test":
			if len(cited) == 0 {
				t.Errorf("%s: status test but no test named", r.id)
			}
		case "open":
			open = append(open, r.id)
			if !strings.Contains(r.evidence, "issue 9") && !strings.Contains(r.evidence, "no test yet") {
				t.Errorf("%s: open without an issue 9 item or \"no test yet\"", r.id)
			}
		case "n/a", "untestable", "deviates":
			if len(strings.Fields(r.evidence)) < 4 {
				t.Errorf("%s: %s without a reason", r.id, r.status)
			}
		default:
			t.Errorf("%s: unknown status %q", r.id, r.status)
		}
		for _, c := range cited {
			pkg, name := c[1], c[2]
			if funcs[pkg] == nil {
				funcs[pkg] = confTestFuncs(t, pkg)
			}
			if !funcs[pkg][name] {
				t.Errorf("%s: %s.%s does not exist", r.id, pkg, name)
			}
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s appears %d times", id, n)
		}
	}
	sum := confMapSummary(t)
	total := 0
	for _, st := range []string{"test", "n/a", "untestable", "deviates", "open"} {
		if sum[st] != counts[st] {
			t.Errorf("summary says %d %s, the rows %d", sum[st], st, counts[st])
		}
		total += counts[st]
	}
	if sum["**total**"] != total {
		t.Errorf("summary total %d, rows %d", sum["**total**"], total)
	}
	if got := confMapOpenList(t); strings.Join(got, ",") != strings.Join(open, ",") {
		t.Errorf("open list %v, open rows %v", got, open)
	}

	// The checklist is kept with the package (testdata/checklist.md, a
	// copy of checklist.md of the shared specs); RDMAFS_CHECKLIST names
	// another copy to check against.
	path := os.Getenv("RDMAFS_CHECKLIST")
	if path == "" {
		path = filepath.Join("testdata", "checklist.md")
	}
	want, err := confChecklist(path)
	if err != nil {
		t.Fatalf("checklist: %v", err)
	}
	if len(want) != checklistItems {
		t.Errorf("checklist has %d items, want %d", len(want), checklistItems)
	}
	byID := map[string]confRow{}
	for _, r := range rows {
		byID[r.id] = r
	}
	for num, id := range want {
		r, ok := byID[id]
		switch {
		case !ok:
			t.Errorf("checklist item %d %s is not mapped", num, id)
		case r.num != num:
			t.Errorf("%s is item %d of the checklist, row %d", id, num, r.num)
		}
	}
	for id := range byID {
		found := false
		for _, w := range want {
			found = found || w == id
		}
		if !found {
			t.Errorf("%s is not a checklist id", id)
		}
	}
}

type confRow struct {
	num                  int
	id, status, evidence string
}

var confIDRe = regexp.MustCompile(`^[A-Z0-9]+-[A-Za-z0-9.-]+$`)

// confMapRows returns the requirement rows of CONFORMANCE.md: | # | id |
// role | level | requirement | status | covered by / reason |.
func confMapRows(t *testing.T) []confRow {
	t.Helper()
	var rows []confRow
	for i, line := range confLines(t, "CONFORMANCE.md") {
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 2 || !confIDRe.MatchString(strings.TrimSpace(cells[1])) {
			continue
		}
		if len(cells) != 7 {
			t.Fatalf("CONFORMANCE.md line %d: %d cells, want 7 (a | in the text?)", i+1, len(cells))
		}
		num, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			t.Fatalf("CONFORMANCE.md line %d: item number %q", i+1, cells[0])
		}
		rows = append(rows, confRow{num: num, id: strings.TrimSpace(cells[1]),
			status: strings.TrimSpace(cells[5]), evidence: strings.TrimSpace(cells[6])})
	}
	return rows
}

// confMapSummary returns the counts of the summary table.
func confMapSummary(t *testing.T) map[string]int {
	t.Helper()
	sum := map[string]int{}
	for _, line := range confLines(t, "CONFORMANCE.md") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			continue
		}
		n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(cells[2]), "*"))
		if err == nil {
			sum[strings.TrimSpace(cells[0])] = n
		}
	}
	return sum
}

// confMapOpenList returns the ids listed under "## Open ids".
func confMapOpenList(t *testing.T) []string {
	t.Helper()
	lines := confLines(t, "CONFORMANCE.md")
	for i, line := range lines {
		if line == "## Open ids" {
			for _, l := range lines[i+1:] {
				if l = strings.TrimSpace(l); l != "" {
					if l == "none" {
						return nil
					}
					return strings.Split(strings.ReplaceAll(l, " ", ""), ",")
				}
			}
		}
	}
	t.Fatal("CONFORMANCE.md has no \"## Open ids\" section")
	return nil
}

func confLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// confTestFuncs returns the Test and Fuzz functions of a package, given
// by its directory relative to the repository root.
func confTestFuncs(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", filepath.FromSlash(pkg), "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("package %s: no test files (%v)", pkg, err)
	}
	re := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]*)\(`)
	funcs := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			funcs[string(m[1])] = true
		}
	}
	return funcs
}

// confChecklist returns the checklist's ids by item number. An item line
// is "N. ID · § · LEVEL · role — text".
func confChecklist(path string) (map[int]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	re := regexp.MustCompile(`^(\d+)\. (\S+) · `)
	ids := map[int]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			ids[n] = m[2]
		}
	}
	return ids, sc.Err()
}
