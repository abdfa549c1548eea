package tfpolicy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// GameDayVariable is the root variable that turns the game day on
// (docs/cloud.md); FaultEnvPrefix begins the name of every executor
// variable of a fault (functions/executor/fault's EnvPause*).
const (
	GameDayVariable = "game_day"
	FaultEnvPrefix  = "EXECUTOR_FAULT_"
)

// checkGameDayOff: the variable game_day exists in the root module and
// defaults to null, and every object key naming a fault variable
// (EXECUTOR_FAULT_...) sits in the true branch of a conditional whose
// condition refers to var.game_day (directly or through root locals), so
// that no plan without the variable arms a fault.
func checkGameDayOff(c *Config) []Violation {
	const rule = "game-day-off"
	var out []Violation
	root := c.Root
	v, ok := root.Variables[GameDayVariable]
	switch {
	case !ok:
		out = append(out, Violation{Rule: rule, Where: "var." + GameDayVariable, Detail: "the root module has no game_day variable"})
	default:
		def, has := v.Body.Attributes["default"]
		if !has {
			out = append(out, Violation{Rule: rule, Where: "var." + GameDayVariable, Detail: "game_day has no default: it must default to null (off)"})
		} else if val, diags := def.Expr.Value(nil); diags.HasErrors() || !val.IsNull() {
			out = append(out, Violation{Rule: rule, Where: "var." + GameDayVariable, Detail: "game_day defaults to something other than null: the game day would be on by default"})
		}
	}
	// The true branches of the conditionals gated on the game day, by file.
	gated := map[string][]hcl.Range{}
	var keys []*hclsyntax.ObjectConsKeyExpr
	files := make([]string, 0, len(c.Files))
	for fn := range c.Files {
		files = append(files, fn)
	}
	sort.Strings(files)
	for _, fn := range files {
		f := c.Files[fn]
		body, ok := f.Body.(*hclsyntax.Body)
		if !ok {
			continue
		}
		_ = hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
			switch e := n.(type) {
			case *hclsyntax.ConditionalExpr:
				if refersToGameDay(root, e.Condition, map[string]bool{}) {
					gated[fn] = append(gated[fn], e.TrueResult.Range())
				}
			case *hclsyntax.ObjectConsKeyExpr:
				r := e.Range()
				if strings.Contains(string(r.SliceBytes(f.Bytes)), FaultEnvPrefix) {
					keys = append(keys, e)
				}
			}
			return nil
		})
	}
	for _, k := range keys {
		r := k.Range()
		inside := false
		for _, g := range gated[r.Filename] {
			if g.ContainsOffset(r.Start.Byte) {
				inside = true
				break
			}
		}
		if !inside {
			out = append(out, Violation{Rule: rule, Where: fmt.Sprintf("%s:%d", r.Filename, r.Start.Line),
				Detail: fmt.Sprintf("%s is set outside a condition on var.%s: the fault would be armed without a game day", strings.Trim(string(r.SliceBytes(c.Files[r.Filename].Bytes)), `"`), GameDayVariable)})
		}
	}
	return out
}

// refersToGameDay reports whether expr refers to var.game_day, directly
// or through the root module's locals.
func refersToGameDay(root *Module, expr hcl.Expression, seen map[string]bool) bool {
	for _, tr := range expr.Variables() {
		if len(tr) < 2 {
			continue
		}
		a, ok := tr[1].(hcl.TraverseAttr)
		if !ok {
			continue
		}
		switch tr.RootName() {
		case "var":
			if a.Name == GameDayVariable {
				return true
			}
		case "local":
			if seen[a.Name] {
				continue
			}
			seen[a.Name] = true
			if l, ok := root.Locals[a.Name]; ok && refersToGameDay(root, l, seen) {
				return true
			}
		}
	}
	return false
}
