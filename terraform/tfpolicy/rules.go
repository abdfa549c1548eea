package tfpolicy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Violation is one breach of one rule.
type Violation struct {
	// Rule is the rule's name (Rule.Name).
	Rule string
	// Where is the resource address, or the file and line.
	Where string
	// Detail says what is wrong.
	Detail string
}

// String is "rule: where: detail".
func (v Violation) String() string { return v.Rule + ": " + v.Where + ": " + v.Detail }

// Rule is one policy check.
type Rule struct {
	// Name is short and stable (tests and reports use it).
	Name string
	// Why is the reason for the rule, one sentence.
	Why string
	// Check returns every violation in c; none means the rule holds.
	Check func(c *Config) []Violation
}

// Rules are every rule of the lab's policy, in the order they are reported.
var Rules = []Rule{
	{"references-resolve", "without the provider schema, terraform validate cannot run here: names must at least resolve", checkReferences},
	{"budget-first", "a plan must never create anything billable before, or without, the billing budget", checkBudgetFirst},
	{"cloudsql-layout", "killing the lock primary (SC-08) must fail lockdb over and leave paydb and raildb untouched", checkCloudSQLLayout},
	{"no-db-password", "databases are reached with IAM authentication: no password in a variable, the state or an output", checkNoDBPassword},
	{"push-subscription", "payout events reach the executor authenticated, in order per account, and undeliverable ones are kept", checkPushSubscription},
	{"no-public-access", "nothing of the lab may be invoked or read by anyone on the internet", checkNoPublicAccess},
	{"cloud-run-scaling", "an idle lab costs nothing and a runaway one costs a bounded amount", checkCloudRunScaling},
	{"cloud-run-startup", "a cold instance must have the time to open its database and migrate before Cloud Run shuts it down", checkCloudRunStartup},
	{"egress-path", "whatever dials Cloud SQL's public address must have a way out of the VPC", checkEgressPath},
	{"cloud-run-metrics", "the functions' metrics must reach Cloud Monitoring, where their alerts are evaluated", checkCloudRunMetrics},
	{"deletion-protection-off", "destroy must reach zero instead of stopping half-way on a protected resource", checkDeletionProtection},
	{"labels", "every labelled resource can be found by the zero-billable check", checkLabels},
	{"game-day-off", "a fault (the executor's pause) is armed only by the game_day variable, which defaults to off", checkGameDayOff},
}

// Check applies every rule to c and returns the violations, rule by rule.
func Check(c *Config) []Violation {
	var out []Violation
	for _, r := range Rules {
		out = append(out, r.Check(c)...)
	}
	return out
}

func violation(rule string, r *Resource, format string, args ...any) Violation {
	return Violation{Rule: rule, Where: r.Addr(), Detail: fmt.Sprintf(format, args...)}
}

func resourcesOfType(c *Config, types ...string) []*Resource {
	var out []*Resource
	for _, r := range c.Resources() {
		for _, t := range types {
			if r.Type == t {
				out = append(out, r)
			}
		}
	}
	return out
}

// checkBudgetFirst: a google_billing_budget exists, and every managed
// resource other than the budget and what the budget itself needs (the
// Billing Budget API) depends on it, directly or through the module that
// creates it.
func checkBudgetFirst(c *Config) []Violation {
	const rule = "budget-first"
	budgets := resourcesOfType(c, "google_billing_budget")
	if len(budgets) == 0 {
		return []Violation{{Rule: rule, Where: c.Root.Dir, Detail: "no google_billing_budget in the configuration"}}
	}
	g := newGraph()
	isBudget := map[node]bool{}
	before := map[node]bool{}
	for _, b := range budgets {
		n := node{"res", b.Module, b.Type + "." + b.Name}
		isBudget[n] = true
		for d := range g.closure(n) {
			before[d] = true
		}
	}
	var out []Violation
	for _, r := range c.Resources() {
		n := node{"res", r.Module, r.Type + "." + r.Name}
		if isBudget[n] || before[n] {
			continue
		}
		found := false
		for d := range g.closure(n) {
			if isBudget[d] {
				found = true
				break
			}
		}
		if !found {
			out = append(out, violation(rule, r, "does not depend on the billing budget (add the budget module to its module's depends_on)"))
		}
	}
	return out
}

// instanceOf returns the google_sql_database_instance a resource's
// "instance" argument refers to.
func instanceOf(r *Resource) *Resource {
	expr := attrExpr(r.Block.Body, "instance")
	if expr == nil {
		return nil
	}
	for _, tr := range expr.Variables() {
		if tr.RootName() == "google_sql_database_instance" && len(tr) > 1 {
			if a, ok := tr[1].(hcl.TraverseAttr); ok {
				return r.Module.Resources["google_sql_database_instance."+a.Name]
			}
		}
	}
	return nil
}

// checkCloudSQLLayout: paydb, raildb and lockdb exist; lockdb's instance is
// REGIONAL and holds neither paydb nor raildb; every instance is of the
// Enterprise edition (PostgreSQL 16 defaults to Enterprise Plus, which
// refuses small tiers).
func checkCloudSQLLayout(c *Config) []Violation {
	const rule = "cloudsql-layout"
	dbs := map[string]*Resource{}
	for _, r := range resourcesOfType(c, "google_sql_database") {
		if name, ok := StringLiteral(attrExpr(r.Block.Body, "name")); ok {
			dbs[name] = r
		}
	}
	var out []Violation
	for _, want := range []string{"paydb", "raildb", "lockdb"} {
		if dbs[want] == nil || instanceOf(dbs[want]) == nil {
			out = append(out, Violation{Rule: rule, Where: c.Root.Dir, Detail: fmt.Sprintf("no google_sql_database named %q on a google_sql_database_instance of the same module", want)})
		}
	}
	if len(out) > 0 {
		return out
	}
	lock := instanceOf(dbs["lockdb"])
	if v, _ := StringLiteral(attrExpr(nested(lock.Block.Body, "settings"), "availability_type")); v != "REGIONAL" {
		out = append(out, violation(rule, lock, "lockdb's instance has settings.availability_type %q, want \"REGIONAL\" (a standby in a second zone)", v))
	}
	for _, other := range []string{"paydb", "raildb"} {
		if inst := instanceOf(dbs[other]); inst == lock {
			out = append(out, violation(rule, dbs[other], "%s is on lockdb's instance %s: killing the lock primary would take it down too", other, lock.Addr()))
		}
	}
	for _, inst := range resourcesOfType(c, "google_sql_database_instance") {
		if v, _ := StringLiteral(attrExpr(nested(inst.Block.Body, "settings"), "edition")); v != "ENTERPRISE" {
			out = append(out, violation(rule, inst, "settings.edition is %q, want \"ENTERPRISE\"", v))
		}
	}
	return out
}

// checkNoDBPassword: every google_sql_user is an IAM user without a
// password, no random_password exists, and no variable or output is named
// like a password or secret.
func checkNoDBPassword(c *Config) []Violation {
	const rule = "no-db-password"
	var out []Violation
	for _, r := range resourcesOfType(c, "google_sql_user") {
		if attrExpr(r.Block.Body, "password") != nil || attrExpr(r.Block.Body, "password_wo") != nil {
			out = append(out, violation(rule, r, "sets a password"))
		}
		if t, _ := StringLiteral(attrExpr(r.Block.Body, "type")); t != "CLOUD_IAM_SERVICE_ACCOUNT" && t != "CLOUD_IAM_USER" {
			out = append(out, violation(rule, r, "type is %q, want CLOUD_IAM_SERVICE_ACCOUNT or CLOUD_IAM_USER", t))
		}
	}
	for _, r := range resourcesOfType(c, "random_password") {
		out = append(out, violation(rule, r, "generates a password, which would be kept in the state"))
	}
	for _, m := range c.Modules() {
		for _, kind := range []struct {
			what  string
			names []string
		}{{"variable", sortedKeys(m.Variables)}, {"output", sortedKeys(m.Outputs)}} {
			for _, n := range kind.names {
				l := strings.ToLower(n)
				if strings.Contains(l, "password") || strings.Contains(l, "secret") {
					out = append(out, Violation{Rule: rule, Where: m.Path + kind.what + "." + n, Detail: "is named like a password or secret"})
				}
			}
		}
	}
	return out
}

// checkPushSubscription: at least one push subscription exists, and each
// has an OIDC token with an audience, message ordering on, a retry
// policy, a dead-letter policy, and an expiration policy with an empty
// TTL (else an idle subscription is deleted after 31 days). Its
// dead-letter topic must be publishable, and the subscription readable,
// by the Pub/Sub service agent: a topic IAM member with
// roles/pubsub.publisher and a subscription IAM member with
// roles/pubsub.subscriber refer to them.
func checkPushSubscription(c *Config) []Violation {
	const rule = "push-subscription"
	var out []Violation
	push := 0
	for _, r := range resourcesOfType(c, "google_pubsub_subscription") {
		pc := nested(r.Block.Body, "push_config")
		if pc == nil {
			continue
		}
		push++
		oidc := nested(pc, "oidc_token")
		if oidc == nil || attrExpr(oidc, "service_account_email") == nil || attrExpr(oidc, "audience") == nil {
			out = append(out, violation(rule, r, "push_config has no oidc_token with service_account_email and audience: the executor would be called unauthenticated"))
		}
		if !isTrue(attrExpr(r.Block.Body, "enable_message_ordering")) {
			out = append(out, violation(rule, r, "enable_message_ordering is not true"))
		}
		if nested(r.Block.Body, "retry_policy") == nil {
			out = append(out, violation(rule, r, "no retry_policy: redeliveries would come without backoff"))
		}
		dl := nested(r.Block.Body, "dead_letter_policy")
		if dl == nil || attrExpr(dl, "dead_letter_topic") == nil {
			out = append(out, violation(rule, r, "no dead_letter_policy with a dead_letter_topic"))
		} else if !grantRefers(c, "google_pubsub_topic_iam_member", "roles/pubsub.publisher", "topic", attrExpr(dl, "dead_letter_topic"), r.Module) {
			out = append(out, violation(rule, r, "the dead-letter topic has no google_pubsub_topic_iam_member granting roles/pubsub.publisher (to the Pub/Sub service agent)"))
		}
		if !grantRefersTo(c, "google_pubsub_subscription_iam_member", "roles/pubsub.subscriber", "subscription", r) {
			out = append(out, violation(rule, r, "no google_pubsub_subscription_iam_member grants roles/pubsub.subscriber on it (to the Pub/Sub service agent)"))
		}
		if ttl, ok := StringLiteral(attrExpr(nested(r.Block.Body, "expiration_policy"), "ttl")); !ok || ttl != "" {
			out = append(out, violation(rule, r, "expiration_policy { ttl = \"\" } is missing: an idle subscription is deleted after 31 days"))
		}
	}
	if push == 0 {
		out = append(out, Violation{Rule: rule, Where: c.Root.Dir, Detail: "no google_pubsub_subscription with a push_config"})
	}
	return out
}

func isTrue(expr hcl.Expression) bool {
	if expr == nil {
		return false
	}
	v, diags := expr.Value(nil)
	return !diags.HasErrors() && v.Type() == cty.Bool && v.IsKnown() && !v.IsNull() && v.True()
}

func isFalse(expr hcl.Expression) bool {
	if expr == nil {
		return false
	}
	v, diags := expr.Value(nil)
	return !diags.HasErrors() && v.Type() == cty.Bool && v.IsKnown() && !v.IsNull() && v.False()
}

// refKeys returns the "type.name" of every resource expr refers to.
func refKeys(expr hcl.Expression) map[string]bool {
	out := map[string]bool{}
	if expr == nil {
		return out
	}
	for _, tr := range expr.Variables() {
		if len(tr) > 1 {
			if a, ok := tr[1].(hcl.TraverseAttr); ok {
				out[tr.RootName()+"."+a.Name] = true
			}
		}
	}
	return out
}

// grantRefers reports whether a resource of grantType in module m with
// role grants on an object (attribute attr) that target, an expression in
// m, refers to as well.
func grantRefers(c *Config, grantType, role, attr string, target hcl.Expression, m *Module) bool {
	want := refKeys(target)
	for _, g := range resourcesOfType(c, grantType) {
		if g.Module != m {
			continue
		}
		if r, _ := StringLiteral(attrExpr(g.Block.Body, "role")); r != role {
			continue
		}
		for k := range refKeys(attrExpr(g.Block.Body, attr)) {
			if want[k] {
				return true
			}
		}
	}
	return false
}

func grantRefersTo(c *Config, grantType, role, attr string, target *Resource) bool {
	for _, g := range resourcesOfType(c, grantType) {
		if g.Module != target.Module {
			continue
		}
		if r, _ := StringLiteral(attrExpr(g.Block.Body, "role")); r != role {
			continue
		}
		if refKeys(attrExpr(g.Block.Body, attr))[target.Type+"."+target.Name] {
			return true
		}
	}
	return false
}

// checkNoPublicAccess: no string anywhere in the configuration names
// allUsers or allAuthenticatedUsers, and no Cloud Run service turns its
// invoker IAM check off.
func checkNoPublicAccess(c *Config) []Violation {
	const rule = "no-public-access"
	var out []Violation
	for _, fn := range sortedKeys(c.Files) {
		body, ok := c.Files[fn].Body.(*hclsyntax.Body)
		if !ok {
			continue
		}
		hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
			lit, ok := n.(*hclsyntax.LiteralValueExpr)
			if !ok || lit.Val.Type() != cty.String || !lit.Val.IsKnown() || lit.Val.IsNull() {
				return nil
			}
			s := lit.Val.AsString()
			for _, public := range []string{"allUsers", "allAuthenticatedUsers"} {
				if strings.Contains(s, public) {
					rg := lit.Range()
					out = append(out, Violation{Rule: rule, Where: fmt.Sprintf("%s:%d", rg.Filename, rg.Start.Line), Detail: "names " + public})
				}
			}
			return nil
		})
	}
	for _, r := range resourcesOfType(c, "google_cloud_run_v2_service") {
		if isTrue(attrExpr(r.Block.Body, "invoker_iam_disabled")) {
			out = append(out, violation(rule, r, "invoker_iam_disabled is true: anyone who reaches it may call it"))
		}
	}
	return out
}

// checkCloudRunScaling: every Cloud Run service scales to zero
// (template.scaling.min_instance_count = 0, and the service-level
// minimum, if set, is 0 too) and has a max_instance_count.
func checkCloudRunScaling(c *Config) []Violation {
	const rule = "cloud-run-scaling"
	var out []Violation
	zero := func(expr hcl.Expression) bool {
		if expr == nil {
			return false
		}
		v, diags := expr.Value(nil)
		return !diags.HasErrors() && v.Type() == cty.Number && v.IsKnown() && !v.IsNull() && v.Equals(cty.Zero).True()
	}
	for _, r := range resourcesOfType(c, "google_cloud_run_v2_service") {
		sc := nested(r.Block.Body, "template", "scaling")
		if !zero(attrExpr(sc, "min_instance_count")) {
			out = append(out, violation(rule, r, "template.scaling.min_instance_count is not the literal 0"))
		}
		if attrExpr(sc, "max_instance_count") == nil {
			out = append(out, violation(rule, r, "template.scaling.max_instance_count is not set: no cap on instances"))
		}
		if svc := nested(r.Block.Body, "scaling"); svc != nil {
			if e := attrExpr(svc, "min_instance_count"); e != nil && !zero(e) {
				out = append(out, violation(rule, r, "scaling.min_instance_count (service level) is not 0"))
			}
		}
	}
	return out
}

// checkCloudRunMetrics: every Cloud Run service runs Managed Service for
// Prometheus' sidecar (a container whose image is, or defaults to, one
// of cloud-run-gmp-sidecar, started after the serving container, the one
// with ports) and keeps its CPU between requests, since the sidecar
// scrapes on a timer (cpu_idle is the literal false, or a module variable
// whose default is false and which the module's call does not set).
func checkCloudRunMetrics(c *Config) []Violation {
	const rule = "cloud-run-metrics"
	var out []Violation
	for _, r := range resourcesOfType(c, "google_cloud_run_v2_service") {
		tmpl := nested(r.Block.Body, "template")
		var app, sidecar *hclsyntax.Body
		for _, ct := range blocks(tmpl, "containers") {
			switch {
			case len(blocks(ct.Body, "ports")) > 0:
				app = ct.Body
			case strings.Contains(literalOrDefault(r.Module, attrExpr(ct.Body, "image")), "cloud-run-gmp-sidecar"):
				sidecar = ct.Body
			}
		}
		if sidecar == nil {
			out = append(out, violation(rule, r, "no managed Prometheus sidecar container: the function's /metrics reach nobody"))
			continue
		}
		appName, _ := StringLiteral(attrExpr(app, "name"))
		var after []string
		if e := attrExpr(sidecar, "depends_on"); e != nil {
			if v, diags := e.Value(nil); !diags.HasErrors() && v.CanIterateElements() {
				for it := v.ElementIterator(); it.Next(); {
					if _, el := it.Element(); el.Type() == cty.String {
						after = append(after, el.AsString())
					}
				}
			}
		}
		if appName == "" || !slices.Contains(after, appName) {
			out = append(out, violation(rule, r, "the sidecar does not depend on the serving container (named, with ports)"))
		}
		if !cpuKept(r, attrExpr(nested(app, "resources"), "cpu_idle")) {
			out = append(out, violation(rule, r, "cpu_idle may be true: the sidecar's timed scrapes would get no CPU between requests"))
		}
		if !cpuKept(r, attrExpr(nested(sidecar, "resources"), "cpu_idle")) {
			out = append(out, violation(rule, r, "the sidecar's cpu_idle is not stated false like the serving container's: the instance's containers would disagree about its CPU"))
		}
	}
	return out
}

// literalOrDefault is the value of a string literal, or the default of the
// module variable var.X that expr is; "" otherwise.
func literalOrDefault(m *Module, expr hcl.Expression) string {
	if s, ok := StringLiteral(expr); ok {
		return s
	}
	if tr, ok := expr.(*hclsyntax.ScopeTraversalExpr); ok && tr.Traversal.RootName() == "var" && len(tr.Traversal) == 2 {
		if v := m.Variables[tr.Traversal[1].(hcl.TraverseAttr).Name]; v != nil {
			s, _ := StringLiteral(attrExpr(v.Body, "default"))
			return s
		}
	}
	return ""
}

// cpuKept reports whether idle, the cpu_idle of r, is false for every
// instance of r's module: the literal false, or var.X whose default is
// false and which the module's call does not set.
func cpuKept(r *Resource, idle hcl.Expression) bool {
	if idle == nil {
		return false
	}
	if isFalse(idle) {
		return true
	}
	tr, ok := idle.(*hclsyntax.ScopeTraversalExpr)
	if !ok || tr.Traversal.RootName() != "var" || len(tr.Traversal) != 2 {
		return false
	}
	name := tr.Traversal[1].(hcl.TraverseAttr).Name
	v := r.Module.Variables[name]
	if v == nil || !isFalse(attrExpr(v.Body, "default")) {
		return false
	}
	if r.Module.Call != nil {
		if e := attrExpr(r.Module.Call.Body, name); e != nil && !isFalse(e) {
			return false
		}
	}
	return true
}

// protectedByDefault are the resource types the provider protects from
// deletion unless deletion_protection = false is said.
var protectedByDefault = []string{"google_cloud_run_v2_service", "google_container_cluster", "google_sql_database_instance"}

// checkDeletionProtection: every type the provider protects by default
// says deletion_protection = false, and no Cloud SQL instance turns on its
// API-level deletion protection.
func checkDeletionProtection(c *Config) []Violation {
	const rule = "deletion-protection-off"
	var out []Violation
	for _, r := range resourcesOfType(c, protectedByDefault...) {
		if !isFalse(attrExpr(r.Block.Body, "deletion_protection")) {
			out = append(out, violation(rule, r, "deletion_protection is not the literal false: destroy would stop on it"))
		}
		if r.Type == "google_sql_database_instance" {
			if e := attrExpr(nested(r.Block.Body, "settings"), "deletion_protection_enabled"); e != nil && !isFalse(e) {
				out = append(out, violation(rule, r, "settings.deletion_protection_enabled is not false"))
			}
		}
	}
	return out
}

// labelPath gives, for each resource type that takes labels, the nested
// blocks and attribute that hold them.
var labelPath = map[string][]string{
	"google_artifact_registry_repository": {"labels"},
	"google_cloud_run_v2_service":         {"labels"},
	"google_compute_address":              {"labels"},
	"google_container_cluster":            {"resource_labels"},
	"google_monitoring_alert_policy":      {"user_labels"},
	"google_pubsub_subscription":          {"labels"},
	"google_pubsub_topic":                 {"labels"},
	"google_secret_manager_secret":        {"labels"},
	"google_sql_database_instance":        {"settings", "user_labels"},
	"google_storage_bucket":               {"labels"},
}

// unlabelled are the resource types that take no labels (IAM bindings,
// accounts, API enablement, the budget, networks, databases and users).
var unlabelled = map[string]bool{
	"google_artifact_registry_repository_iam_member": true,
	"google_billing_budget":                          true,
	"google_cloud_run_v2_service_iam_member":         true,
	"google_compute_network":                         true,
	"google_compute_subnetwork":                      true,
	"google_project_iam_member":                      true,
	"google_secret_manager_secret_iam_member":        true,
	"google_cloud_scheduler_job":                     true, // no labels in the API
	"google_project_service":                         true,
	"google_project_service_identity":                true,
	"google_pubsub_subscription_iam_member":          true,
	"google_pubsub_topic_iam_member":                 true,
	"google_service_account":                         true,
	"google_service_account_iam_member":              true,
	"google_sql_database":                            true,
	"google_sql_user":                                true,
	"google_storage_bucket_iam_member":               true,
	"random_id":                                      true,
	"time_sleep":                                     true, // a wait, nothing billed
}

// checkLabels: every resource whose type takes labels sets them, and every
// resource type is known to take labels or not (a new type must be added
// to one table, so that the rule cannot be passed by accident).
func checkLabels(c *Config) []Violation {
	const rule = "labels"
	var out []Violation
	for _, r := range c.Resources() {
		path, takes := labelPath[r.Type]
		switch {
		case unlabelled[r.Type]:
		case !takes:
			out = append(out, violation(rule, r, "type %s is in neither table of tfpolicy (labelPath, unlabelled): say whether it takes labels", r.Type))
		default:
			body := nested(r.Block.Body, path[:len(path)-1]...)
			expr := attrExpr(body, path[len(path)-1])
			if expr == nil {
				out = append(out, violation(rule, r, "%s is not set", strings.Join(path, ".")))
				continue
			}
			if v, diags := expr.Value(nil); !diags.HasErrors() && v.IsKnown() && !v.IsNull() && v.LengthInt() == 0 {
				out = append(out, violation(rule, r, "%s is empty", strings.Join(path, ".")))
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Where < out[j].Where })
	return out
}
