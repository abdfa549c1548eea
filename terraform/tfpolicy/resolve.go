package tfpolicy

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// moduleMetaArgs are the arguments of a module block that are not the
// module's variables.
var moduleMetaArgs = map[string]bool{
	"source": true, "version": true, "providers": true, "depends_on": true, "count": true, "for_each": true,
}

// checkReferences is the part of `terraform validate` that needs no
// provider schema: every var, local, module output, data source and
// resource an expression names exists in its module; every argument of a
// module call is a variable of that module, and every variable without a
// default is given.
func checkReferences(c *Config) []Violation {
	const rule = "references-resolve"
	var out []Violation
	for _, m := range c.Modules() {
		where := func(rg hcl.Range) string { return fmt.Sprintf("%s:%d", rg.Filename, rg.Start.Line) }
		check := func(expr hcl.Expression) {
			for _, tr := range expr.Variables() {
				if msg := unresolved(m, tr); msg != "" {
					out = append(out, Violation{Rule: rule, Where: where(tr.SourceRange()), Detail: msg})
				}
			}
		}
		var walk func(body *hclsyntax.Body)
		walk = func(body *hclsyntax.Body) {
			for _, a := range body.Attributes {
				check(a.Expr)
			}
			for _, b := range body.Blocks {
				if b.Type != "lifecycle" {
					walk(b.Body)
				}
			}
		}
		for _, r := range m.Resources {
			walk(r.Block.Body)
		}
		for _, b := range m.Data {
			walk(b.Body)
		}
		for _, e := range m.Locals {
			check(e)
		}
		for _, e := range m.Outputs {
			check(e)
		}
		for _, name := range sortedKeys(m.Children) {
			child := m.Children[name]
			walk(child.Call.Body)
			for arg, a := range child.Call.Body.Attributes {
				if !moduleMetaArgs[arg] && child.Variables[arg] == nil {
					out = append(out, Violation{Rule: rule, Where: where(a.SrcRange), Detail: fmt.Sprintf("module %q has no variable %q", name, arg)})
				}
			}
			for _, v := range sortedKeys(child.Variables) {
				if attrExpr(child.Variables[v].Body, "default") == nil && attrExpr(child.Call.Body, v) == nil {
					out = append(out, Violation{Rule: rule, Where: where(child.Call.DefRange()), Detail: fmt.Sprintf("module %q: required variable %q is not given", name, v)})
				}
			}
		}
	}
	return out
}

// unresolved returns why tr names nothing in m, or "".
func unresolved(m *Module, tr hcl.Traversal) string {
	attr := func(i int) string {
		if len(tr) > i {
			if a, ok := tr[i].(hcl.TraverseAttr); ok {
				return a.Name
			}
		}
		return ""
	}
	switch root := tr.RootName(); root {
	case "var":
		if m.Variables[attr(1)] == nil {
			return "no variable " + attr(1) + " in this module"
		}
	case "local":
		if _, ok := m.Locals[attr(1)]; !ok {
			return "no local " + attr(1) + " in this module"
		}
	case "module":
		child := m.Children[attr(1)]
		if child == nil {
			return "no module call " + attr(1)
		}
		if o := attr(2); o != "" {
			if _, ok := child.Outputs[o]; !ok {
				return fmt.Sprintf("module %s has no output %s", attr(1), o)
			}
		}
	case "data":
		if m.Data[attr(1)+"."+attr(2)] == nil {
			return "no data source " + attr(1) + "." + attr(2) + " in this module"
		}
	case "self", "each", "count", "path", "terraform":
	default:
		// Resource types are provider_type; other roots are dynamic-block
		// iterators and provider names.
		if strings.Contains(root, "_") && m.Resources[root+"."+attr(1)] == nil {
			return "no resource " + root + "." + attr(1) + " in this module"
		}
	}
	return ""
}
