package literaltest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryADRIsInTheIndex checks that docs/adr/README.md links every
// decision record docs/adr/0*.md, so that a new ADR cannot be added
// without its row.
func TestEveryADRIsInTheIndex(t *testing.T) {
	dir := filepath.Join(moduleRoot(t), "docs", "adr")
	adrs, err := filepath.Glob(filepath.Join(dir, "0*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(adrs) == 0 {
		t.Fatalf("no ADR found in %s", dir)
	}
	index, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range adrs {
		name := filepath.Base(path)
		if !strings.Contains(string(index), "]("+name+")") {
			t.Errorf("docs/adr/%s is not linked from docs/adr/README.md; add its row (number, title, status, one line)", name)
		}
	}
}
