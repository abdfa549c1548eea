// Package literals finds Go string literals that spell a wire contract
// (an error code, a route, an environment variable name) outside the one
// package allowed to spell it. The api packages' tests use it to keep
// each contract spelled once: functions/paymentresource/api and
// functions/railproxy/api.
package literals

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
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
	skip := map[string]bool{}
	for _, d := range skipDirs {
		skip[filepath.Clean(d)] = true
	}
	allowed := map[string]bool{}
	for _, f := range allowedFiles {
		allowed[filepath.Clean(f)] = true
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[path] || (path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || allowed[path] {
			return nil
		}
		files++
		hits, err := InSource(fset, path, nil, pats)
		for _, h := range hits {
			rel, relErr := filepath.Rel(root, h)
			if relErr != nil {
				rel = h
			}
			found = append(found, rel)
		}
		return err
	})
	return found, files, err
}
