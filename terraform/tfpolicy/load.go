// Package tfpolicy checks the lab's Terraform configuration (terraform/)
// offline: Load parses the root module and the local modules it calls with
// hashicorp/hcl (no provider schema, no network) into a dependency graph,
// and Check applies the rules that keep an apply safe and a destroy
// complete (every name resolves, every resource depends on the billing
// budget, nothing public or deletion-protected, labels everywhere, ...). It
// checks what the configuration says, not what Google will do with it.
//
// Why not OPA/conftest, a tflint ruleset or tfsec: conftest sees each file's
// HCL as JSON, without references resolved across modules, and a tflint
// plugin would be Go code of the same size; tfsec (run in `make lint`)
// checks generic security, not this project's rules.
package tfpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// ErrLoad wraps every error of Load: a directory without .tf files, a
// file that does not parse, a module whose source is not a local path.
var ErrLoad = errors.New("tfpolicy: cannot load configuration")

// Config is a parsed root module and the local modules it calls.
type Config struct {
	// Root is the root module.
	Root *Module
	// Files are the parsed files of every module, by path.
	Files map[string]*hcl.File
}

// Module is one module instance of the configuration.
type Module struct {
	// Path is the address prefix of the module's resources: "" for the
	// root, "module.x." for a module called x from the root.
	Path string
	// Dir is the module's source directory.
	Dir string
	// Parent is the calling module (nil for the root).
	Parent *Module
	// Call is the module block in Parent that calls this module (nil for
	// the root).
	Call *hclsyntax.Block
	// Resources are the managed resources by "type.name".
	Resources map[string]*Resource
	// Data are the data sources by "type.name".
	Data map[string]*hclsyntax.Block
	// Locals, Outputs and Variables by name (variable blocks).
	Locals    map[string]hcl.Expression
	Outputs   map[string]hcl.Expression
	Variables map[string]*hclsyntax.Block
	// Children are the modules this one calls, by call name.
	Children map[string]*Module
}

// Resource is one managed resource block.
type Resource struct {
	// Type and Name are the block's two labels.
	Type, Name string
	// Block is the parsed resource block.
	Block *hclsyntax.Block
	// Module is the module instance the block is in.
	Module *Module
}

// Addr is the resource's address without instance keys, such as
// "module.pubsub.google_pubsub_topic.payouts".
func (r *Resource) Addr() string { return r.Module.Path + r.Type + "." + r.Name }

// Load parses the root module in dir and every local module it calls,
// recursively. It returns an error wrapping ErrLoad.
func Load(dir string) (*Config, error) {
	c := &Config{Files: map[string]*hcl.File{}}
	p := hclparse.NewParser()
	root, err := c.loadModule(p, dir, "", nil, nil, 0)
	if err != nil {
		return nil, err
	}
	c.Root = root
	return c, nil
}

func (c *Config) loadModule(p *hclparse.Parser, dir, path string, parent *Module, call *hclsyntax.Block, depth int) (*Module, error) {
	if depth > 8 {
		return nil, fmt.Errorf("%w: modules nested deeper than 8 at %s", ErrLoad, dir)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLoad, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no .tf files in %s", ErrLoad, dir)
	}
	sort.Strings(files)
	m := &Module{
		Path: path, Dir: dir, Parent: parent, Call: call,
		Resources: map[string]*Resource{}, Data: map[string]*hclsyntax.Block{},
		Locals: map[string]hcl.Expression{}, Outputs: map[string]hcl.Expression{},
		Variables: map[string]*hclsyntax.Block{}, Children: map[string]*Module{},
	}
	type childCall struct {
		name string
		blk  *hclsyntax.Block
	}
	var calls []childCall
	for _, fn := range files {
		src, err := os.ReadFile(fn)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrLoad, err)
		}
		f, diags := p.ParseHCL(src, fn)
		if diags.HasErrors() {
			return nil, fmt.Errorf("%w: %s", ErrLoad, diags.Error())
		}
		c.Files[fn] = f
		body, ok := f.Body.(*hclsyntax.Body)
		if !ok {
			return nil, fmt.Errorf("%w: %s is not native HCL syntax", ErrLoad, fn)
		}
		for _, b := range body.Blocks {
			switch b.Type {
			case "resource":
				if len(b.Labels) == 2 {
					m.Resources[b.Labels[0]+"."+b.Labels[1]] = &Resource{Type: b.Labels[0], Name: b.Labels[1], Block: b, Module: m}
				}
			case "data":
				if len(b.Labels) == 2 {
					m.Data[b.Labels[0]+"."+b.Labels[1]] = b
				}
			case "locals":
				for name, a := range b.Body.Attributes {
					m.Locals[name] = a.Expr
				}
			case "output":
				if a, ok := b.Body.Attributes["value"]; ok && len(b.Labels) == 1 {
					m.Outputs[b.Labels[0]] = a.Expr
				}
			case "variable":
				if len(b.Labels) == 1 {
					m.Variables[b.Labels[0]] = b
				}
			case "module":
				if len(b.Labels) == 1 {
					calls = append(calls, childCall{b.Labels[0], b})
				}
			}
		}
	}
	for _, cc := range calls {
		src, ok := StringLiteral(attrExpr(cc.blk.Body, "source"))
		if !ok || !(strings.HasPrefix(src, "./") || strings.HasPrefix(src, "../")) {
			return nil, fmt.Errorf("%w: module %q in %s: source must be a local path (./ or ../)", ErrLoad, cc.name, dir)
		}
		child, err := c.loadModule(p, filepath.Join(dir, src), path+"module."+cc.name+".", m, cc.blk, depth+1)
		if err != nil {
			return nil, err
		}
		m.Children[cc.name] = child
	}
	return m, nil
}

// Modules returns every module of the configuration, the root first, then
// depth first in call-name order.
func (c *Config) Modules() []*Module {
	var out []*Module
	var walk func(m *Module)
	walk = func(m *Module) {
		out = append(out, m)
		for _, n := range sortedKeys(m.Children) {
			walk(m.Children[n])
		}
	}
	walk(c.Root)
	return out
}

// Resources returns every managed resource of the configuration, ordered
// by address.
func (c *Config) Resources() []*Resource {
	var out []*Resource
	for _, m := range c.Modules() {
		for _, r := range m.Resources {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr() < out[j].Addr() })
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// attrExpr returns the expression of attribute name in body, or nil.
func attrExpr(body *hclsyntax.Body, name string) hcl.Expression {
	if body == nil {
		return nil
	}
	if a, ok := body.Attributes[name]; ok {
		return a.Expr
	}
	return nil
}

// blocks returns the nested blocks of body with type typ.
func blocks(body *hclsyntax.Body, typ string) []*hclsyntax.Block {
	if body == nil {
		return nil
	}
	var out []*hclsyntax.Block
	for _, b := range body.Blocks {
		if b.Type == typ {
			out = append(out, b)
		}
	}
	return out
}

// nested follows a path of nested block types from body ("settings",
// "ip_configuration") and returns the body of the first block at the end,
// or nil.
func nested(body *hclsyntax.Body, path ...string) *hclsyntax.Body {
	for _, typ := range path {
		bs := blocks(body, typ)
		if len(bs) == 0 {
			return nil
		}
		body = bs[0].Body
	}
	return body
}

// StringLiteral returns the value of expr when it is a constant string
// (a literal or a template without interpolations).
func StringLiteral(expr hcl.Expression) (string, bool) {
	if expr == nil {
		return "", false
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() || !v.IsKnown() || v.IsNull() || v.Type().FriendlyName() != "string" {
		return "", false
	}
	return v.AsString(), true
}
