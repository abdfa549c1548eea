package tfpolicy

import (
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// node is a vertex of the dependency graph: a resource, data source,
// local value, module variable, module output, or a module call's
// depends_on.
type node struct {
	kind string // "res", "data", "local", "var", "out", "call"
	mod  *Module
	name string // "type.name" for res and data; the name otherwise
}

// graph resolves the dependencies of nodes the way Terraform does from the
// source: a reference to a resource, local, variable or module output, and
// depends_on, of a resource itself or of the module call it is inside.
type graph struct {
	memo map[node][]node
}

func newGraph() *graph { return &graph{memo: map[node][]node{}} }

// deps returns the direct dependencies of n.
func (g *graph) deps(n node) []node {
	if d, ok := g.memo[n]; ok {
		return d
	}
	var out []node
	m := n.mod
	switch n.kind {
	case "res":
		if r := m.Resources[n.name]; r != nil {
			out = refsInBody(m, r.Block.Body)
		}
		if m.Call != nil {
			out = append(out, node{"call", m, ""})
		}
	case "data":
		if b := m.Data[n.name]; b != nil {
			out = refsInBody(m, b.Body)
		}
		if m.Call != nil {
			out = append(out, node{"call", m, ""})
		}
	case "local":
		out = refsInExpr(m, m.Locals[n.name])
	case "out":
		out = refsInExpr(m, m.Outputs[n.name])
	case "var":
		// A module variable is the call's argument, evaluated in the caller.
		if m.Call != nil && m.Parent != nil {
			out = refsInExpr(m.Parent, attrExpr(m.Call.Body, n.name))
		}
	case "call":
		// depends_on of a module call applies to everything inside it, and
		// to everything inside the module that contains the call.
		if m.Call != nil && m.Parent != nil {
			out = refsInExpr(m.Parent, attrExpr(m.Call.Body, "depends_on"))
			if m.Parent.Call != nil {
				out = append(out, node{"call", m.Parent, ""})
			}
		}
	}
	g.memo[n] = out
	return out
}

// closure returns every node n depends on, directly or not.
func (g *graph) closure(n node) map[node]bool {
	seen := map[node]bool{}
	stack := []node{n}
	for len(stack) > 0 {
		cur := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, d := range g.deps(cur) {
			if !seen[d] {
				seen[d] = true
				stack = append(stack, d)
			}
		}
	}
	return seen
}

// refsInBody returns the references of every expression in body and its
// nested blocks, except the lifecycle block (whose ignore_changes names
// attributes, not objects).
func refsInBody(m *Module, body *hclsyntax.Body) []node {
	var out []node
	for _, a := range body.Attributes {
		out = append(out, refsInExpr(m, a.Expr)...)
	}
	for _, b := range body.Blocks {
		if b.Type == "lifecycle" {
			continue
		}
		out = append(out, refsInBody(m, b.Body)...)
	}
	return out
}

// refsInExpr resolves the free variables of expr (for-expression
// iterators and dynamic-block iterators name nothing here and are
// dropped) in module m.
func refsInExpr(m *Module, expr hcl.Expression) []node {
	if expr == nil {
		return nil
	}
	var out []node
	for _, tr := range expr.Variables() {
		if n, ok := resolve(m, tr); ok {
			out = append(out, n...)
		}
	}
	return out
}

func resolve(m *Module, tr hcl.Traversal) ([]node, bool) {
	root := tr.RootName()
	attr := func(i int) string {
		if len(tr) > i {
			if a, ok := tr[i].(hcl.TraverseAttr); ok {
				return a.Name
			}
		}
		return ""
	}
	switch root {
	case "var":
		return []node{{"var", m, attr(1)}}, true
	case "local":
		return []node{{"local", m, attr(1)}}, true
	case "data":
		return []node{{"data", m, attr(1) + "." + attr(2)}}, true
	case "module":
		child := m.Children[attr(1)]
		if child == nil {
			return nil, false
		}
		if out := attr(2); out != "" {
			return []node{{"out", child, out}}, true
		}
		var all []node
		for _, o := range sortedKeys(child.Outputs) {
			all = append(all, node{"out", child, o})
		}
		return all, true
	case "self", "each", "count", "path", "terraform":
		return nil, false
	}
	key := root + "." + attr(1)
	if _, ok := m.Resources[key]; ok {
		return []node{{"res", m, key}}, true
	}
	return nil, false
}

// ResourceDeps returns, for every managed resource of c by address, the
// addresses of the managed resources it depends on directly: through its
// own references and depends_on, and through the locals, module
// variables, module outputs, data sources and module-call depends_on
// those lead to, up to the first resource on each path. Sorted.
func (c *Config) ResourceDeps() map[string][]string {
	g := newGraph()
	out := map[string][]string{}
	for _, r := range c.Resources() {
		start := node{"res", r.Module, r.Type + "." + r.Name}
		seen := map[node]bool{}
		found := map[string]bool{}
		stack := append([]node(nil), g.deps(start)...)
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[n] {
				continue
			}
			seen[n] = true
			if n.kind == "res" {
				if dep := n.mod.Resources[n.name]; dep != nil && dep != r {
					found[dep.Addr()] = true
				}
				continue
			}
			stack = append(stack, g.deps(n)...)
		}
		deps := make([]string, 0, len(found))
		for a := range found {
			deps = append(deps, a)
		}
		sort.Strings(deps)
		out[r.Addr()] = deps
	}
	return out
}
