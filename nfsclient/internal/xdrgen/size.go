package xdrgen

import "strconv"

// minSize returns the least number of bytes d takes in XDR (RFC 4506):
// what a decoder bounds an array's count by. It errs low: 0 for what it
// cannot tell (an extern of unknown size, a recursive type through
// itself), which leaves a count bounded by bytes only.
func (g *gen) minSize(d decl, visiting map[string]bool) int {
	d, err := g.resolve(d)
	if err != nil {
		return 0
	}
	switch {
	case d.kind == kVoid:
		return 0
	case d.opt, d.varlen:
		return 4 // FALSE, or a zero count
	case d.fixed != "":
		e := d
		e.fixed = ""
		return g.intValue(d.fixed) * g.minSize(e, visiting)
	}
	switch d.kind {
	case kPrim:
		if d.typ == "uint64" || d.typ == "int64" {
			return 8
		}
		return 4
	case kString:
		return 4
	case kOpaque:
		if d.ofixed != "" {
			n := g.intValue(d.ofixed)
			return n + (4-n%4)%4
		}
		return 4
	}
	return g.namedMinSize(d.typ, visiting)
}

// namedMinSize is minSize of the named type name.
func (g *gen) namedMinSize(name string, visiting map[string]bool) int {
	if _, ok := g.s.externs[name]; ok {
		return g.s.extMin[name]
	}
	t := g.s.types[name]
	if t == nil || visiting[name] {
		return 0
	}
	if visiting == nil {
		visiting = map[string]bool{}
	}
	visiting[name] = true
	defer delete(visiting, name)
	switch t.kind {
	case "enum":
		return 4
	case "struct":
		n := 0
		for _, f := range t.fields {
			n += g.minSize(f, visiting)
		}
		return n
	case "union":
		least := -1
		for _, a := range t.arms {
			if m := g.minSize(a.d, visiting); least < 0 || m < least {
				least = m
			}
		}
		return g.minSize(t.disc, visiting) + max(least, 0)
	}
	return 0
}

// intValue is the value of a number or constant; 0 if it is neither.
func (g *gen) intValue(v string) int {
	if n, err := strconv.Atoi(v); err == nil {
		return n
	}
	for _, c := range g.s.consts {
		if c[0] == v {
			return g.intValue(c[1])
		}
	}
	return 0
}
