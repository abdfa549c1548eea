package literaltest_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/distributed-lock-lab/distributed-lock-lab/"

// modulePath matches a package of this module named by its folder.
var modulePath = regexp.MustCompile(`\b(?:etcd|functions|harness|internal|local|lockserver|ops|terraform)(?:/[a-z0-9_]+)+`)

// sentenceEnd ends a sentence: a full stop, or a colon before an example.
var sentenceEnd = regexp.MustCompile(`[.:](\s|$)`)

// docImportClaim reads the sentence of a package doc that says what the
// package imports ("It imports only the standard library, X and Y."), and
// returns the module packages it names, folder-relative; ok is false when
// the doc makes no such claim. "the api package" names the api folder
// beside the package's own.
func docImportClaim(doc, dir string) (named map[string]bool, ok bool) {
	doc = strings.Join(strings.Fields(strings.ReplaceAll(doc, "/\n", "/")), " ")
	i := strings.Index(doc, "imports only")
	if i < 0 {
		return nil, false
	}
	sentence := doc[i:]
	if j := sentenceEnd.FindStringIndex(sentence); j != nil {
		sentence = sentence[:j[0]]
	}
	named = map[string]bool{}
	for _, p := range modulePath.FindAllString(sentence, -1) {
		named[p] = true
	}
	if strings.Contains(sentence, "the api package") {
		named[filepath.ToSlash(filepath.Join(filepath.Dir(dir), "api"))] = true
	}
	return named, true
}

// TestPackageDocsNameTheirImportsTruly holds every package doc that says
// what its package imports ("imports only the standard library and ...")
// to the imports of its non-test files: each module package the sentence
// names is imported, each one imported is named, and nothing outside the
// standard library and this module is imported at all.
func TestPackageDocsNameTheirImportsTruly(t *testing.T) {
	root := moduleRoot(t)
	checked := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "out") {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		doc, imports, err := packageDocAndImports(path)
		if err != nil {
			return err
		}
		named, ok := docImportClaim(doc, filepath.ToSlash(rel))
		if !ok {
			return nil
		}
		checked++
		for _, msg := range claimErrors(named, imports) {
			t.Errorf("%s: package doc: %s", rel, msg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 5 {
		t.Fatalf("found only %d package docs that say what they import; the walk or the sentence match is broken", checked)
	}
}

// claimErrors compares the module packages a doc names with the imports.
func claimErrors(named map[string]bool, imports []string) []string {
	var errs []string
	imported := map[string]bool{}
	for _, imp := range imports {
		switch {
		case strings.HasPrefix(imp, module):
			imported[strings.TrimPrefix(imp, module)] = true
		case !strings.Contains(strings.SplitN(imp, "/", 2)[0], "."):
			// the standard library
		default:
			errs = append(errs, "says it imports only the standard library and this module, but imports "+imp)
		}
	}
	for p := range imported {
		if !named[p] {
			errs = append(errs, "imports "+p+" and does not say so")
		}
	}
	for p := range named {
		if !imported[p] {
			errs = append(errs, "names "+p+" as an import, which the package does not import")
		}
	}
	sort.Strings(errs)
	return errs
}

// packageDocAndImports parses the non-test Go files of dir: the package
// doc (from the file that has one) and every import.
func packageDocAndImports(dir string) (doc string, imports []string, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", nil, err
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return "", nil, err
		}
		if f.Doc != nil && doc == "" {
			doc = f.Doc.Text()
		}
		for _, imp := range f.Imports {
			imports = append(imports, strings.Trim(imp.Path.Value, `"`))
		}
	}
	return doc, imports, nil
}

// TestDocImportClaimCatchesAFalseList shows the check failing on the kinds
// of false sentence it exists for.
func TestDocImportClaimCatchesAFalseList(t *testing.T) {
	named, ok := docImportClaim("Package client is a client.\nIt imports only the standard library, the api package and functions/\npayoutevent. More.", "functions/railproxy/client")
	if !ok || !named["functions/railproxy/api"] || !named["functions/payoutevent"] || len(named) != 2 {
		t.Fatalf("claim read as %v, %v; want the api folder and functions/payoutevent", named, ok)
	}
	errs := claimErrors(named, []string{"net/http", module + "functions/railproxy/api", module + "internal/jsonclient", "github.com/jackc/pgx/v5"})
	want := []string{
		"imports internal/jsonclient and does not say so",
		"names functions/payoutevent as an import, which the package does not import",
		"says it imports only the standard library and this module, but imports github.com/jackc/pgx/v5",
	}
	if strings.Join(errs, "\n") != strings.Join(want, "\n") {
		t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(errs, "\n"), strings.Join(want, "\n"))
	}
	if _, ok := docImportClaim("Package x does things. It imports what it needs.", "x"); ok {
		t.Fatal("a doc without the claim was read as making one")
	}
}
