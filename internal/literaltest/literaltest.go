// Package literals finds Go string literals that spell a wire contract
// (an error code, a route, an environment variable name) outside the one
// package allowed to spell it. The api packages' tests use it to keep
// each contract spelled once: functions/paymentresource/api and
// functions/railproxy/api. It also finds log event names (the value of
// the "event" attribute) spelled as literals instead of the owning
// package's Event constants, and lists those constants so that a test can
// check docs/log-events.md names each. StructsInModule finds a second
// definition of a contract's body: a struct with the same JSON fields.
package literaltest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Patterns maps a spelling of the contract (as reported) to a pattern that
// matches it inside the value of a string literal.
type Patterns map[string]*regexp.Regexp

// Word returns a pattern matching s as a whole word: not preceded or
// followed by a letter, digit or underscore ("RAIL_URL" does not match
// "RAIL_PROXY_URL=", nor "UNAVAILABLE" "DATABASE_UNAVAILABLE").
func Word(s string) *regexp.Regexp {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(s) + `($|[^A-Za-z0-9_])`)
}

// Path returns a pattern matching the route prefix p anywhere, when it is
// not continued by a letter, digit, '_' or '-' ("/v1/payouts" matches
// "/v1/payouts/" and "POST /v1/payouts", not "/v1/payoutsx").
func Path(p string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(p) + `($|[^A-Za-z0-9_-])`)
}

// Route returns a pattern matching the relative route p as a path of
// its own: not continued by a letter, digit, '_' or '-', and not preceded
// by one ("/submit" matches "/submit" and base+"/submit?x", not
// "/v1/rail/submit" nor "/submits"). A host written before it in the same
// literal hides it.
func Route(p string) *regexp.Regexp {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_-])` + regexp.QuoteMeta(p) + `($|[^A-Za-z0-9_-])`)
}

// InSource returns "file:line:col: literal spells X" for every string
// literal of the Go source src (read from name when src is nil) whose
// value matches a pattern, in source order.
func InSource(fset *token.FileSet, name string, src any, pats Patterns) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(pats))
	for what := range pats {
		names = append(names, what)
	}
	sort.Strings(names)
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		v, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		for _, what := range names {
			if pats[what].MatchString(v) {
				found = append(found, fset.Position(lit.Pos()).String()+": "+lit.Value+" spells "+what)
			}
		}
		return true
	})
	return found, nil
}

// InModule checks every non-test Go file under root (a module root) but
// those in the directories skipDirs, in hidden directories, testdata and
// vendor, and but the files allowedFiles (absolute paths). It returns the
// findings with paths relative to root, and how many files it checked.
func InModule(root string, skipDirs, allowedFiles []string, pats Patterns) (found []string, files int, err error) {
	return inModule(root, skipDirs, allowedFiles, false, pats)
}

// InModuleTests is InModule over the test files (_test.go) instead.
func InModuleTests(root string, skipDirs, allowedFiles []string, pats Patterns) (found []string, files int, err error) {
	return inModule(root, skipDirs, allowedFiles, true, pats)
}

func inModule(root string, skipDirs, allowedFiles []string, tests bool, pats Patterns) (found []string, files int, err error) {
	fset := token.NewFileSet()
	err = walkGo(root, skipDirs, allowedFiles, tests, func(path string) error {
		files++
		hits, err := InSource(fset, path, nil, pats)
		found = append(found, relTo(root, hits)...)
		return err
	})
	return found, files, err
}

// walkGo calls check with the path of every Go file under root that is a
// test file when tests is true, and is not one otherwise, but those in the
// directories skipDirs, in hidden directories, testdata and vendor, and
// but the files allowedFiles (absolute paths).
func walkGo(root string, skipDirs, allowedFiles []string, tests bool, check func(path string) error) error {
	skip := map[string]bool{}
	for _, d := range skipDirs {
		skip[filepath.Clean(d)] = true
	}
	allowed := map[string]bool{}
	for _, f := range allowedFiles {
		allowed[filepath.Clean(f)] = true
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[path] || (path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") != tests || allowed[path] {
			return nil
		}
		return check(path)
	})
}

// relTo makes the paths that begin the findings relative to root.
func relTo(root string, hits []string) []string {
	out := make([]string, 0, len(hits))
	for _, h := range hits {
		rel, err := filepath.Rel(root, h)
		if err != nil {
			rel = h
		}
		out = append(out, rel)
	}
	return out
}

// EventKey is the slog attribute that names what happened (docs/log-events.md).
const EventKey = "event"

// EventsInSource returns "file:line:col: event name spelled as a literal"
// for every place in the Go source src (read from name when src is nil)
// where the value given to the "event" attribute contains a string
// literal: the argument after "event" in a call (a slog method, With,
// slog.String, slog.Any) or in an []any list of attributes, and the value
// of an "event" key in a composite literal. An event name must be a
// constant of the package that owns the event, so that a renamed event is
// a compile error in every logger and reader of it.
func EventsInSource(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var found []string
	check := func(list []ast.Expr) {
		for i := 0; i+1 < len(list); i++ {
			if isEventKey(list[i]) {
				if lit := firstString(list[i+1]); lit != nil {
					found = append(found, fset.Position(lit.Pos()).String()+": event name "+lit.Value+" spelled as a literal")
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			check(n.Args)
		case *ast.CompositeLit:
			if isAnySlice(n.Type) {
				check(n.Elts)
			}
			for _, e := range n.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok && isEventKey(kv.Key) {
					if lit := firstString(kv.Value); lit != nil {
						found = append(found, fset.Position(lit.Pos()).String()+": event name "+lit.Value+" spelled as a literal")
					}
				}
			}
		}
		return true
	})
	return found, nil
}

// isEventKey reports whether e is the string literal "event".
func isEventKey(e ast.Expr) bool {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return false
	}
	v, err := strconv.Unquote(lit.Value)
	return err == nil && v == EventKey
}

// firstString returns the first string literal inside e (e itself, or a
// part of a concatenation, a conversion, an index), or nil.
func firstString(e ast.Expr) *ast.BasicLit {
	var lit *ast.BasicLit
	ast.Inspect(e, func(n ast.Node) bool {
		if lit != nil {
			return false
		}
		if b, ok := n.(*ast.BasicLit); ok && b.Kind == token.STRING {
			lit = b
			return false
		}
		return true
	})
	return lit
}

// isAnySlice reports whether t is []any or []interface{}, the type of a
// list of slog attributes.
func isAnySlice(t ast.Expr) bool {
	at, ok := t.(*ast.ArrayType)
	if !ok || at.Len != nil {
		return false
	}
	switch el := at.Elt.(type) {
	case *ast.Ident:
		return el.Name == "any"
	case *ast.InterfaceType:
		return el.Methods == nil || len(el.Methods.List) == 0
	}
	return false
}

// EventsInModule runs EventsInSource over every non-test Go file under
// root (a module root), but hidden directories, testdata and vendor. It
// returns the findings with paths relative to root, and how many files it
// checked.
func EventsInModule(root string) (found []string, files int, err error) {
	fset := token.NewFileSet()
	err = walkGo(root, nil, nil, false, func(path string) error {
		files++
		hits, err := EventsInSource(fset, path, nil)
		found = append(found, relTo(root, hits)...)
		return err
	})
	return found, files, err
}

// EventConstants returns every event name the module's non-test Go files
// declare, with where: the string value of each constant whose name begins
// with "Event" or "event" (the convention of every package that owns log
// events), mapped to "file:line" positions relative to root.
func EventConstants(root string) (map[string][]string, error) {
	fset := token.NewFileSet()
	out := map[string][]string{}
	err := walkGo(root, nil, nil, false, func(path string) error {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Event") && !strings.HasPrefix(n.Name, "event") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						continue
					}
					pos := fset.Position(n.Pos())
					rel, relErr := filepath.Rel(root, pos.Filename)
					if relErr != nil {
						rel = pos.Filename
					}
					out[v] = append(out[v], rel+":"+strconv.Itoa(pos.Line))
				}
			}
		}
		return nil
	})
	return out, err
}

// Shapes maps the name of a contract's body type to its set of JSON field
// names.
type Shapes map[string][]string

// StructsInSource returns "file:line:col: struct has the JSON fields of X"
// for every struct type of the Go source src (read from name when src is
// nil), named or anonymous, whose JSON field names are exactly those of
// the shape X: a second definition of a contract's body.
func StructsInSource(fset *token.FileSet, name string, src any, shapes Shapes) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	keys := map[string]string{}
	for what, fields := range shapes {
		keys[fieldKey(fields)] = what
	}
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		st, ok := n.(*ast.StructType)
		if !ok {
			return true
		}
		var fields []string
		for _, fl := range st.Fields.List {
			if fl.Tag == nil {
				continue
			}
			tag, err := strconv.Unquote(fl.Tag.Value)
			if err != nil {
				continue
			}
			if j, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ","); j != "" && j != "-" {
				fields = append(fields, j)
			}
		}
		if what, ok := keys[fieldKey(fields)]; ok && len(fields) > 0 {
			found = append(found, fmt.Sprintf("%s: struct has the JSON fields of %s", fset.Position(st.Pos()), what))
		}
		return true
	})
	return found, nil
}

// StructsInModule is StructsInSource over every Go file under root, test
// files included, but those in skipDirs (as InModule skips them).
func StructsInModule(root string, skipDirs []string, shapes Shapes) (found []string, files int, err error) {
	fset := token.NewFileSet()
	for _, tests := range []bool{false, true} {
		err = walkGo(root, skipDirs, nil, tests, func(path string) error {
			files++
			hits, err := StructsInSource(fset, path, nil, shapes)
			found = append(found, relTo(root, hits)...)
			return err
		})
		if err != nil {
			return found, files, err
		}
	}
	return found, files, nil
}

func fieldKey(fields []string) string {
	s := slices.Clone(fields)
	slices.Sort(s)
	return strings.Join(s, ",")
}
