package tfpolicy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Cloud Run's limits on a startup probe (cloud.google.com/run/docs/configuring/healthchecks):
// initial_delay_seconds and period_seconds at most 240 each, and
// period_seconds × failure_threshold at most 240.
const cloudRunStartupMax = 240

// StartupFloor is the least time a Cloud Run service's startup probe
// must give a cold instance before Cloud Run shuts it down: the Cloud SQL
// connector's first dial (instance metadata, an ephemeral certificate, a
// TLS handshake on port 3307) and the migrations of payment-resource and
// rail-proxy, which run before they listen, on an instance whose CPU is
// shared with its metrics sidecar.
const StartupFloor = 60

// numberValue is the value of expr when it is a whole-number constant, the
// variable var.X of r's module (the call's constant argument, else the
// variable's default), or ok false.
func numberValue(r *Resource, expr hcl.Expression) (int64, bool) {
	v, ok := moduleConst(r, expr)
	if !ok || v.Type() != cty.Number {
		return 0, false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, false
	}
	n, _ := bf.Int64()
	return n, true
}

// moduleConst evaluates expr as a constant, or as var.X of r's module:
// the module call's argument when it is a constant, else the variable's
// default when the call does not set it.
func moduleConst(r *Resource, expr hcl.Expression) (cty.Value, bool) {
	if expr == nil {
		return cty.NilVal, false
	}
	if v, diags := expr.Value(nil); !diags.HasErrors() && v.IsKnown() && !v.IsNull() {
		return v, true
	}
	tr, ok := expr.(*hclsyntax.ScopeTraversalExpr)
	if !ok || tr.Traversal.RootName() != "var" || len(tr.Traversal) != 2 {
		return cty.NilVal, false
	}
	name := tr.Traversal[1].(hcl.TraverseAttr).Name
	if r.Module.Call != nil {
		if e := attrExpr(r.Module.Call.Body, name); e != nil {
			v, diags := e.Value(nil)
			if diags.HasErrors() || !v.IsKnown() || v.IsNull() {
				return cty.NilVal, false
			}
			return v, true
		}
	}
	vb := r.Module.Variables[name]
	if vb == nil {
		return cty.NilVal, false
	}
	d := attrExpr(vb.Body, "default")
	if d == nil {
		return cty.NilVal, false
	}
	v, diags := d.Value(nil)
	if diags.HasErrors() || !v.IsKnown() || v.IsNull() {
		return cty.NilVal, false
	}
	return v, true
}

// servingContainer is the body of the container of a Cloud Run service
// that declares ports (the one Cloud Run sends requests to).
func servingContainer(r *Resource) *hclsyntax.Body {
	for _, ct := range blocks(nested(r.Block.Body, "template"), "containers") {
		if len(blocks(ct.Body, "ports")) > 0 {
			return ct.Body
		}
	}
	return nil
}

// checkCloudRunStartup: the serving container of every Cloud Run service
// has a startup probe whose four timings are stated (a block left with
// only its check takes the provider's schema defaults, 3 × 10 s, not
// Cloud Run's one try of 240 s), within Cloud Run's limits, and giving a
// cold instance at least StartupFloor seconds.
func checkCloudRunStartup(c *Config) []Violation {
	const rule = "cloud-run-startup"
	var out []Violation
	for _, r := range resourcesOfType(c, "google_cloud_run_v2_service") {
		app := servingContainer(r)
		sp := nested(app, "startup_probe")
		if sp == nil {
			out = append(out, violation(rule, r, "the serving container has no startup_probe"))
			continue
		}
		vals := map[string]int64{}
		missing := false
		for _, f := range []string{"initial_delay_seconds", "period_seconds", "timeout_seconds", "failure_threshold"} {
			n, ok := numberValue(r, attrExpr(sp, f))
			if !ok {
				out = append(out, violation(rule, r, "startup_probe.%s is not a stated whole number: the provider's default would apply", f))
				missing = true
				continue
			}
			vals[f] = n
		}
		if missing {
			continue
		}
		delay, period, timeout, failures := vals["initial_delay_seconds"], vals["period_seconds"], vals["timeout_seconds"], vals["failure_threshold"]
		if delay > cloudRunStartupMax || period*failures > cloudRunStartupMax {
			out = append(out, violation(rule, r, "startup_probe exceeds Cloud Run's limits (initial_delay_seconds %d, period_seconds × failure_threshold %d; at most %d each)", delay, period*failures, cloudRunStartupMax))
		}
		if timeout > period {
			out = append(out, violation(rule, r, "startup_probe.timeout_seconds %d exceeds period_seconds %d", timeout, period))
		}
		if w := delay + period*failures; w < StartupFloor {
			out = append(out, violation(rule, r, "startup_probe gives a cold instance %d s, less than %d s: the connector's first dial and the migrations may not be done", w, StartupFloor))
		}
	}
	return out
}

// envKeys returns the constant keys of an environment map expression: an
// object constructor, or merge(...) of object constructors.
func envKeys(expr hcl.Expression) []string {
	var out []string
	switch e := expr.(type) {
	case *hclsyntax.ObjectConsExpr:
		for _, it := range e.Items {
			if k, diags := it.KeyExpr.Value(nil); !diags.HasErrors() && k.Type() == cty.String && k.IsKnown() && !k.IsNull() {
				out = append(out, k.AsString())
			}
		}
	case *hclsyntax.FunctionCallExpr:
		if e.Name == "merge" {
			for _, a := range e.Args {
				out = append(out, envKeys(a)...)
			}
		}
	}
	return out
}

// checkEgressPath: without a Cloud NAT (google_compute_router_nat) in the
// configuration, whatever reaches Cloud SQL's public address must have a
// way out of Google's network of its own. A Cloud Run service that names
// an instance (an environment variable ending in _INSTANCE, which the
// Cloud SQL Go connector dials) must send only private ranges through
// the VPC (PRIVATE_RANGES_ONLY): with ALL_TRAFFIC the dial goes into the
// subnet and finds no route out. The GKE cluster's nodes must keep their
// public addresses (no private nodes), through which lock-server's Auth
// Proxy reaches the lock instance and the nodes pull their images.
func checkEgressPath(c *Config) []Violation {
	const rule = "egress-path"
	if len(resourcesOfType(c, "google_compute_router_nat")) > 0 {
		return nil
	}
	var out []Violation
	for _, r := range resourcesOfType(c, "google_cloud_run_v2_service") {
		var sql []string
		if r.Module.Call != nil {
			for _, k := range envKeys(attrExpr(r.Module.Call.Body, "env")) {
				if strings.HasSuffix(k, "_INSTANCE") {
					sql = append(sql, k)
				}
			}
		}
		if len(sql) == 0 {
			continue
		}
		sort.Strings(sql)
		egress, ok := moduleConst(r, attrExpr(nested(r.Block.Body, "template", "vpc_access"), "egress"))
		if !ok || egress.Type() != cty.String || egress.AsString() != "PRIVATE_RANGES_ONLY" {
			got := "not a constant"
			if ok && egress.Type() == cty.String {
				got = fmt.Sprintf("%q", egress.AsString())
			}
			out = append(out, violation(rule, r, "names a Cloud SQL instance (%s) but its VPC egress is %s, not PRIVATE_RANGES_ONLY, and there is no Cloud NAT: the connector's dial to the public address has no way out", strings.Join(sql, ", "), got))
		}
	}
	for _, r := range resourcesOfType(c, "google_container_cluster") {
		private := isTrue(attrExpr(nested(r.Block.Body, "private_cluster_config"), "enable_private_nodes")) ||
			isTrue(attrExpr(nested(r.Block.Body, "network_config"), "enable_private_nodes"))
		if private {
			out = append(out, violation(rule, r, "has private nodes and there is no Cloud NAT: the Auth Proxy could not reach Cloud SQL's public address, nor the nodes pull public images"))
		}
	}
	return out
}
