// Package xdrgen generates Go codecs from a description of XDR types (RFC
// 4506 s6 language: const, enum, typedef, struct, union) and of NFSv4
// COMPOUND operations, for package nfsclient.
//
// Besides the XDR definitions, the description holds directives, one a
// line, starting with '%':
//
//	%extern xdrname GoType [N]    a type with hand-written encode/decode methods,
//	                              whose least XDR encoding is N bytes (default 0)
//	%gotype enumname GoType       the Go type an enum's fields have (default uint32)
//	%op NUM NAME Stem key=value... flags
//
// An %op declares a COMPOUND operation once: its number and name, the
// types of its arguments (args=) and of its result body on success
// (res=), a body that follows some failure status (fail=Status:type, or
// fail=*:type for every status), whether the server is asked to cache its
// reply (cached), the bytes its result adds to the reply-size estimate
// (reply=N), and whether its codec is hand-written (hand). For each op
// not marked hand, Generate writes a type <stem>Op with the op's arguments
// and results and the methods the COMPOUND engine calls.
//
// Only the types an op or a %root reaches get Go code, and only in the
// direction it is used: argument types get encode, result types decode.
package xdrgen

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

type kind int

const (
	kPrim   kind = iota // int, unsigned int, hyper, unsigned hyper, bool
	kNamed              // struct, union, enum, extern or typedef
	kOpaque             // opaque data
	kString             // string
	kVoid               // void
)

// decl is one declaration: a field, a union arm, or a typedef's body.
type decl struct {
	name   string
	kind   kind
	typ    string // for kPrim: the Go type; for kNamed: the XDR name
	fixed  string // [N]: fixed-length array
	varlen bool   // <N>: variable-length array
	bound  string // N of <N>; "" for <>
	opt    bool   // *name: optional-data
	ofixed string // opaque[N]: fixed-length opaque data
	olen   string // opaque<N>, string<N>: the length bound; "" for <>

}

type unionArm struct {
	cases []string // discriminant values; nil for default
	d     decl
}

type typeDef struct {
	name   string
	kind   string // struct, union, enum, typedef
	fields []decl
	disc   decl
	arms   []unionArm
	enums  [][2]string
	alias  decl
	doc    string
}

type opDef struct {
	num                  int
	name, stem           string
	args, res            string
	failStatus, failType string
	cached, hand         bool
	reply                int
}

type spec struct {
	consts  [][2]string
	types   map[string]*typeDef
	order   []string
	externs map[string]string
	extMin  map[string]int // an extern's least XDR size
	gotypes map[string]string
	ops     []*opDef
	roots   map[string]int // type -> dirEncode|dirDecode
}

const (
	dirEncode = 1
	dirDecode = 2
)

type lexer struct {
	toks []string
	pos  int
	doc  []string // comment text before each token
}

func lex(src string) (*lexer, []string, error) {
	var directives []string
	l := &lexer{}
	var pendingDoc strings.Builder
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == '%' && (i == 0 || src[i-1] == '\n'):
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			directives = append(directives, strings.TrimSpace(src[i+1:i+j]))
			i += j
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			j := strings.Index(src[i+2:], "*/")
			if j < 0 {
				return nil, nil, fmt.Errorf("unterminated comment")
			}
			pendingDoc.WriteString(src[i+2 : i+2+j])
			i += j + 4
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			pendingDoc.WriteString(src[i+2:i+j] + "\n")
			i += j
		case unicode.IsSpace(rune(c)):
			if c == '\n' && i+1 < len(src) && src[i+1] == '\n' {
				pendingDoc.Reset() // a blank line ends a comment's scope
			}
			i++
		case strings.IndexByte("{}()[]<>;:,=*", c) >= 0:
			l.add(string(c), &pendingDoc)
			i++
		case c == '_' || c == '-' || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)):
			j := i + 1
			for j < len(src) && (src[j] == '_' || unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j]))) {
				j++
			}
			l.add(src[i:j], &pendingDoc)
			i = j
		default:
			return nil, nil, fmt.Errorf("unexpected character %q", c)
		}
	}
	return l, directives, nil
}

func (l *lexer) add(t string, doc *strings.Builder) {
	l.toks = append(l.toks, t)
	l.doc = append(l.doc, doc.String())
	doc.Reset()
}

func (l *lexer) peek() string {
	if l.pos < len(l.toks) {
		return l.toks[l.pos]
	}
	return ""
}

func (l *lexer) next() string {
	t := l.peek()
	l.pos++
	return t
}

func (l *lexer) expect(t string) error {
	if got := l.next(); got != t {
		return fmt.Errorf("token %d: got %q, want %q (after %q)", l.pos, got, t, strings.Join(l.toks[max(0, l.pos-6):l.pos], " "))
	}
	return nil
}

func parse(src string) (*spec, error) {
	l, directives, err := lex(src)
	if err != nil {
		return nil, err
	}
	s := &spec{types: map[string]*typeDef{}, externs: map[string]string{}, extMin: map[string]int{}, gotypes: map[string]string{}, roots: map[string]int{}}
	for l.peek() != "" {
		doc := l.doc[l.pos]
		var t *typeDef
		switch kw := l.next(); kw {
		case "const":
			name := l.next()
			if err := l.expect("="); err != nil {
				return nil, err
			}
			s.consts = append(s.consts, [2]string{name, l.next()})
			if err := l.expect(";"); err != nil {
				return nil, err
			}
			continue
		case "enum":
			t, err = parseEnum(l)
		case "typedef":
			var d decl
			d, err = parseDecl(l)
			t = &typeDef{name: d.name, kind: "typedef", alias: d}
		case "struct":
			t, err = parseStruct(l)
		case "union":
			t, err = parseUnion(l)
		default:
			return nil, fmt.Errorf("token %d: unexpected %q", l.pos, kw)
		}
		if err != nil {
			return nil, err
		}
		t.doc = doc
		if err := s.addType(t, l); err != nil {
			return nil, err
		}
	}
	for _, dir := range directives {
		if err := s.directive(dir); err != nil {
			return nil, fmt.Errorf("%%%s: %w", dir, err)
		}
	}
	return s, nil
}

// parseEnum parses an enum's name and body, after "enum".
func parseEnum(l *lexer) (*typeDef, error) {
	t := &typeDef{name: l.next(), kind: "enum"}
	if err := l.expect("{"); err != nil {
		return nil, err
	}
	for l.peek() != "}" {
		n := l.next()
		if err := l.expect("="); err != nil {
			return nil, err
		}
		t.enums = append(t.enums, [2]string{n, l.next()})
		if l.peek() == "," {
			l.next()
		}
	}
	l.next()
	return t, nil
}

// parseStruct parses a struct's name and fields, after "struct".
func parseStruct(l *lexer) (*typeDef, error) {
	t := &typeDef{name: l.next(), kind: "struct"}
	if err := l.expect("{"); err != nil {
		return nil, err
	}
	for l.peek() != "}" {
		d, err := parseDecl(l)
		if err != nil {
			return nil, err
		}
		if err := l.expect(";"); err != nil {
			return nil, err
		}
		t.fields = append(t.fields, d)
	}
	l.next()
	return t, nil
}

// parseUnion parses a discriminated union (RFC 4506 s4.15) after
// "union": its name, discriminant and arms.
func parseUnion(l *lexer) (*typeDef, error) {
	t := &typeDef{name: l.next(), kind: "union"}
	for _, w := range []string{"switch", "("} {
		if err := l.expect(w); err != nil {
			return nil, err
		}
	}
	d, err := parseDecl(l)
	if err != nil {
		return nil, err
	}
	t.disc = d
	for _, w := range []string{")", "{"} {
		if err := l.expect(w); err != nil {
			return nil, err
		}
	}
	for l.peek() != "}" {
		var arm unionArm
		for l.peek() == "case" || l.peek() == "default" {
			if l.next() == "case" {
				arm.cases = append(arm.cases, l.next())
			} else {
				arm.cases = nil
			}
			if err := l.expect(":"); err != nil {
				return nil, err
			}
		}
		if arm.d, err = parseDecl(l); err != nil {
			return nil, err
		}
		if err := l.expect(";"); err != nil {
			return nil, err
		}
		t.arms = append(t.arms, arm)
	}
	l.next()
	return t, nil
}

func (s *spec) addType(t *typeDef, l *lexer) error {
	if err := l.expect(";"); err != nil {
		return err
	}
	if _, dup := s.types[t.name]; dup {
		return fmt.Errorf("type %s defined twice", t.name)
	}
	s.types[t.name] = t
	s.order = append(s.order, t.name)
	return nil
}

var prims = map[string]string{
	"int": "int32", "hyper": "int64", "bool": "bool",
	"uint32_t": "uint32", "int32_t": "int32", "uint64_t": "uint64", "int64_t": "int64",
}

func parseDecl(l *lexer) (decl, error) {
	var d decl
	t := l.next()
	switch t {
	case "void":
		d.kind = kVoid
		return d, nil
	case "unsigned":
		d.kind = kPrim
		switch l.peek() {
		case "hyper":
			l.next()
			d.typ = "uint64"
		case "int":
			l.next()
			d.typ = "uint32"
		default:
			d.typ = "uint32"
		}
	case "opaque":
		d.kind = kOpaque
	case "string":
		d.kind = kString
	default:
		if g, ok := prims[t]; ok {
			d.kind, d.typ = kPrim, g
		} else {
			d.kind, d.typ = kNamed, t
		}
	}
	if l.peek() == "*" {
		l.next()
		d.opt = true
	}
	d.name = l.next()
	bytes := d.kind == kOpaque || d.kind == kString
	switch l.peek() {
	case "[":
		l.next()
		n := l.next()
		if d.kind == kOpaque {
			d.ofixed = n
		} else if bytes {
			return d, fmt.Errorf("string %s: no fixed-length strings", d.name)
		} else {
			d.fixed = n
		}
		if err := l.expect("]"); err != nil {
			return d, err
		}
	case "<":
		l.next()
		n := ""
		if l.peek() != ">" {
			n = l.next()
		}
		if bytes {
			d.olen = n
		} else {
			d.varlen, d.bound = true, n
		}
		if err := l.expect(">"); err != nil {
			return d, err
		}
	default:
		if bytes {
			return d, fmt.Errorf("%s %s needs a length", t, d.name)
		}
	}
	return d, nil
}

func (s *spec) directive(line string) error {
	f := strings.Fields(line)
	if len(f) == 0 {
		return fmt.Errorf("empty directive")
	}
	switch f[0] {
	case "extern", "gotype":
		if f[0] == "extern" && len(f) == 4 {
			n, err := strconv.Atoi(f[3])
			if err != nil || n < 0 {
				return fmt.Errorf("extern %s: bad least size %q", f[1], f[3])
			}
			s.extMin[f[1]] = n
			f = f[:3]
		}
		if len(f) != 3 {
			return fmt.Errorf("want %s xdrname GoType", f[0])
		}
		if f[0] == "extern" {
			s.externs[f[1]] = f[2]
		} else {
			s.gotypes[f[1]] = f[2]
		}
	case "root":
		if len(f) != 3 || (f[2] != "encode" && f[2] != "decode") {
			return fmt.Errorf("want root type encode|decode")
		}
		if f[2] == "encode" {
			s.roots[f[1]] |= dirEncode
		} else {
			s.roots[f[1]] |= dirDecode
		}
	case "op":
		if len(f) < 4 {
			return fmt.Errorf("want op NUM NAME Stem [attributes]")
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return err
		}
		o := &opDef{num: n, name: f[2], stem: f[3], reply: 128}
		for _, a := range f[4:] {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "args":
				o.args = v
			case "res":
				o.res = v
			case "fail":
				st, typ, ok := strings.Cut(v, ":")
				if !ok {
					return fmt.Errorf("fail=Status:type")
				}
				o.failStatus, o.failType = st, typ
			case "cached":
				o.cached = true
			case "hand":
				o.hand = true
			case "reply":
				if o.reply, err = strconv.Atoi(v); err != nil {
					return err
				}
			default:
				return fmt.Errorf("unknown op attribute %q", a)
			}
		}
		s.ops = append(s.ops, o)
	default:
		return fmt.Errorf("unknown directive")
	}
	return nil
}
