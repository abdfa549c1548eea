package tfpolicy_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfpolicy"
)

// root is the lab's real root module.
const root = ".."

func TestRealModuleKeepsEveryRule(t *testing.T) {
	c, err := tfpolicy.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range tfpolicy.Check(c) {
		t.Errorf("%s", v)
	}
	// The rules looked at something: the module has the resources they
	// are about.
	counts := map[string]int{}
	for _, r := range c.Resources() {
		counts[r.Type]++
	}
	for typ, want := range map[string]int{
		"google_billing_budget":        1,
		"google_cloud_run_v2_service":  5, // one block, in five module calls (four functions and the reconciler)
		"google_sql_database_instance": 2,
		"google_pubsub_subscription":   2,
		"google_container_cluster":     1,
	} {
		if counts[typ] != want {
			t.Errorf("%d %s blocks, want %d", counts[typ], typ, want)
		}
	}
}

// edit is one textual change to a file of the module, relative to root.
type edit struct {
	file, old, new string
}

// brokenCopy copies the root module and its modules to a temporary
// directory, applies the edits (each old string must occur exactly once,
// so that a stale edit cannot pass by changing nothing) and loads it.
func brokenCopy(t *testing.T, edits ...edit) *tfpolicy.Config {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && rel != "modules" && !strings.HasPrefix(rel, "modules"+string(filepath.Separator)) {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !strings.HasSuffix(path, ".tf") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		p := filepath.Join(dst, e.file)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), e.old); n != 1 {
			t.Fatalf("edit of %s: %q occurs %d times, want exactly once", e.file, e.old, n)
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), e.old, e.new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, err := tfpolicy.Load(dst)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Each case breaks the module in one way and expects exactly the named
// rule to report it, with a detail containing want.
var brokenCases = []struct {
	name  string
	rule  string
	edits []edit
	want  string
}{
	{
		name:  "a misspelt module argument",
		rule:  "references-resolve",
		edits: []edit{{"main.tf", "  max_instances   = var.max_instances\n  request_timeout", "  max_instance    = var.max_instances\n  request_timeout"}},
		want:  `module "executor" has no variable "max_instance"`,
	},
	{
		name:  "a required module variable not given",
		rule:  "references-resolve",
		edits: []edit{{"main.tf", "  ack_deadline_seconds      = local.ack_deadline_seconds\n", ""}},
		want:  `required variable "ack_deadline_seconds" is not given`,
	},
	{
		name:  "an output the module does not have",
		rule:  "references-resolve",
		edits: []edit{{"outputs.tf", "module.pubsub.dead_letter_subscription", "module.pubsub.dead_letter"}},
		want:  "module pubsub has no output dead_letter",
	},
	{
		name:  "a resource that does not exist",
		rule:  "references-resolve",
		edits: []edit{{"modules/pubsub/main.tf", "value = google_pubsub_subscription.dead_letter.name", "value = google_pubsub_subscription.deadletter.name"}},
		want:  "no resource google_pubsub_subscription.deadletter",
	},
	{
		name: "a billable resource outside every module",
		rule: "budget-first",
		edits: []edit{{"main.tf", "module \"budget\" {",
			"resource \"google_pubsub_topic\" \"stray\" {\n  name   = \"stray\"\n  labels = local.labels\n}\n\nmodule \"budget\" {"}},
		want: "google_pubsub_topic.stray: does not depend on the billing budget",
	},
	{
		name:  "the APIs module no longer waits for the budget",
		rule:  "budget-first",
		edits: []edit{{"main.tf", "  services   = local.services\n  depends_on = [module.budget]\n", "  services   = local.services\n"}},
		want:  "module.apis.google_project_service.this: does not depend",
	},
	{
		name:  "a module that neither waits for nor uses anything after the budget",
		rule:  "budget-first",
		edits: []edit{{"main.tf", "  name_prefix = var.name_prefix\n  depends_on  = [module.budget, module.apis, time_sleep.apis]\n}", "  name_prefix = var.name_prefix\n}"}},
		want:  "module.iam.google_service_account.this: does not depend",
	},
	{
		name: "no budget at all",
		rule: "budget-first",
		edits: []edit{
			{"modules/budget/main.tf", `resource "google_billing_budget" "lab" {`, `resource "google_project_iam_member" "lab" {`},
			{"modules/budget/main.tf", "value = google_billing_budget.lab.id", "value = google_project_iam_member.lab.id"},
		},
		want: "no google_billing_budget",
	},
	{
		name:  "lockdb's instance is zonal",
		rule:  "cloudsql-layout",
		edits: []edit{{"modules/cloudsql/main.tf", `availability_type           = "REGIONAL"`, `availability_type           = "ZONAL"`}},
		want:  `availability_type "ZONAL", want "REGIONAL"`,
	},
	{
		name: "paydb on lockdb's instance",
		rule: "cloudsql-layout",
		edits: []edit{{"modules/cloudsql/main.tf", "name     = \"paydb\"\n  instance = google_sql_database_instance.pay.name",
			"name     = \"paydb\"\n  instance = google_sql_database_instance.lock.name"}},
		want: "paydb is on lockdb's instance",
	},
	{
		name: "an instance of the Enterprise Plus edition",
		rule: "cloudsql-layout",
		edits: []edit{{"modules/cloudsql/main.tf", "    # PostgreSQL 16 defaults to Enterprise Plus, which refuses small tiers.\n    edition                     = \"ENTERPRISE\"",
			"    edition                     = \"ENTERPRISE_PLUS\""}},
		want: `settings.edition is "ENTERPRISE_PLUS"`,
	},
	{
		name: "a built-in user with a password variable",
		rule: "no-db-password",
		edits: []edit{
			{"modules/cloudsql/main.tf", "  for_each = var.lock_users\n  project  = var.project_id\n  instance = google_sql_database_instance.lock.name\n  name     = each.value\n  type     = \"CLOUD_IAM_SERVICE_ACCOUNT\"",
				"  for_each = var.lock_users\n  project  = var.project_id\n  instance = google_sql_database_instance.lock.name\n  name     = each.value\n  type     = \"BUILT_IN\"\n  password = var.db_password"},
			{"modules/cloudsql/main.tf", "variable \"tier\" {", "variable \"db_password\" {\n  type    = string\n  default = \"\"\n}\n\nvariable \"tier\" {"},
		},
		want: "sets a password",
	},
	{
		name:  "push without an OIDC token",
		rule:  "push-subscription",
		edits: []edit{{"modules/pubsub/main.tf", "    oidc_token {\n      service_account_email = var.push_service_account\n      audience              = var.executor_uri\n    }\n", ""}},
		want:  "no oidc_token",
	},
	{
		name:  "push without ordering",
		rule:  "push-subscription",
		edits: []edit{{"modules/pubsub/main.tf", "enable_message_ordering = true", "enable_message_ordering = false"}},
		want:  "enable_message_ordering is not true",
	},
	{
		name: "push without a dead-letter policy",
		rule: "push-subscription",
		edits: []edit{{"modules/pubsub/main.tf", "  dead_letter_policy {\n    dead_letter_topic     = google_pubsub_topic.dead_letter.id\n    max_delivery_attempts = 10\n  }\n",
			""}},
		want: "no dead_letter_policy",
	},
	{
		name:  "the service agent cannot read the source subscription",
		rule:  "push-subscription",
		edits: []edit{{"modules/pubsub/main.tf", `role         = "roles/pubsub.subscriber"`, `role         = "roles/pubsub.viewer"`}},
		want:  "grants roles/pubsub.subscriber",
	},
	{
		name:  "the push subscription expires when idle",
		rule:  "push-subscription",
		edits: []edit{{"modules/pubsub/main.tf", "  # Without this an idle subscription is deleted after 31 days.\n  expiration_policy {\n    ttl = \"\"\n  }\n", ""}},
		want:  "expiration_policy",
	},
	{
		name:  "allUsers may invoke the rail-stub",
		rule:  "no-public-access",
		edits: []edit{{"main.tf", `invokers      = merge({ rail-proxy = "serviceAccount:${local.sa["rail-proxy"]}" }, local.game_day_invokers)`, `invokers      = merge({ rail-proxy = "serviceAccount:${local.sa["rail-proxy"]}", public = "allUsers" }, local.game_day_invokers)`}},
		want:  "names allUsers",
	},
	{
		name:  "invoker IAM check turned off",
		rule:  "no-public-access",
		edits: []edit{{"modules/cloudrun/main.tf", "  deletion_protection = false\n", "  deletion_protection  = false\n  invoker_iam_disabled = true\n"}},
		want:  "invoker_iam_disabled is true",
	},
	{
		name:  "one instance always on",
		rule:  "cloud-run-scaling",
		edits: []edit{{"modules/cloudrun/main.tf", "min_instance_count = 0", "min_instance_count = 1"}},
		want:  "min_instance_count is not the literal 0",
	},
	{
		name:  "no cap on instances",
		rule:  "cloud-run-scaling",
		edits: []edit{{"modules/cloudrun/main.tf", "      max_instance_count = var.max_instances\n", ""}},
		want:  "max_instance_count is not set",
	},
	{
		name:  "no metrics sidecar",
		rule:  "cloud-run-metrics",
		edits: []edit{{"modules/cloudrun/main.tf", "cloud-run-gmp-sidecar/cloud-run-gmp-sidecar", "cloud-run/otel-collector"}},
		want:  "no managed Prometheus sidecar container",
	},
	{
		name:  "the sidecar starting before the function",
		rule:  "cloud-run-metrics",
		edits: []edit{{"modules/cloudrun/main.tf", `depends_on = ["app"]`, `depends_on = []`}},
		want:  "the sidecar does not depend on the serving container",
	},
	{
		name:  "CPU only during requests",
		rule:  "cloud-run-metrics",
		edits: []edit{{"main.tf", "  invokers      = { pubsub-push", "  cpu_idle      = !local.game_day\n  invokers      = { pubsub-push"}},
		want:  "cpu_idle may be true",
	},
	{
		name: "the startup probe left to the provider's defaults",
		rule: "cloud-run-startup",
		edits: []edit{{"modules/cloudrun/main.tf", "        initial_delay_seconds = 5\n        period_seconds        = 5\n        timeout_seconds       = 3\n        failure_threshold     = 23\n",
			""}},
		want: "startup_probe.initial_delay_seconds is not a stated whole number",
	},
	{
		name:  "a cold start cut at 20 s",
		rule:  "cloud-run-startup",
		edits: []edit{{"modules/cloudrun/main.tf", "failure_threshold     = 23", "failure_threshold     = 3"}},
		want:  "gives a cold instance 20 s, less than 60 s",
	},
	{
		name:  "a startup probe beyond Cloud Run's limit",
		rule:  "cloud-run-startup",
		edits: []edit{{"modules/cloudrun/main.tf", "failure_threshold     = 23", "failure_threshold     = 60"}},
		want:  "exceeds Cloud Run's limits",
	},
	{
		name: "rail-proxy sending everything through the VPC",
		rule: "egress-path",
		edits: []edit{{"main.tf", "  image           = local.image[\"rail-proxy\"]\n",
			"  image           = local.image[\"rail-proxy\"]\n  vpc_egress      = \"ALL_TRAFFIC\"\n"}},
		want: "names a Cloud SQL instance (RAILDB_INSTANCE) but its VPC egress is \"ALL_TRAFFIC\"",
	},
	{
		name: "private GKE nodes without a NAT",
		rule: "egress-path",
		edits: []edit{{"modules/gke/main.tf", "  ip_allocation_policy {}\n",
			"  ip_allocation_policy {}\n\n  private_cluster_config {\n    enable_private_nodes = true\n  }\n"}},
		want: "module.gke.google_container_cluster.lab: has private nodes and there is no Cloud NAT",
	},
	{
		name:  "the sidecar on request-based CPU",
		rule:  "cloud-run-metrics",
		edits: []edit{{"modules/cloudrun/main.tf", "        # provider sends false, and one instance's containers must not\n        # disagree about when the instance has CPU.\n        cpu_idle = var.cpu_idle", "        cpu_idle = true"}},
		want:  "the sidecar's cpu_idle is not stated false",
	},
	{
		name:  "the GKE cluster protected",
		rule:  "deletion-protection-off",
		edits: []edit{{"modules/gke/main.tf", "deletion_protection = false", "deletion_protection = true"}},
		want:  "module.gke.google_container_cluster.lab: deletion_protection is not the literal false",
	},
	{
		name:  "a Cloud Run service left at the provider's default",
		rule:  "deletion-protection-off",
		edits: []edit{{"modules/cloudrun/main.tf", "  deletion_protection = false\n", ""}},
		want:  "google_cloud_run_v2_service.this: deletion_protection is not the literal false",
	},
	{
		name:  "lockdb's instance protected at the API",
		rule:  "deletion-protection-off",
		edits: []edit{{"modules/cloudsql/main.tf", "    availability_type           = \"REGIONAL\"\n    deletion_protection_enabled = false", "    availability_type           = \"REGIONAL\"\n    deletion_protection_enabled = true"}},
		want:  "google_sql_database_instance.lock: settings.deletion_protection_enabled is not false",
	},
	{
		name: "the payout topic unlabelled",
		rule: "labels",
		edits: []edit{{"modules/pubsub/main.tf", "  name    = \"${var.name_prefix}-payouts\"\n  labels  = var.labels\n",
			"  name    = \"${var.name_prefix}-payouts\"\n"}},
		want: "module.pubsub.google_pubsub_topic.payouts: labels is not set",
	},
	{
		name: "a resource type the rule does not know",
		rule: "labels",
		edits: []edit{{"modules/registry/main.tf", "resource \"google_artifact_registry_repository\" \"images\" {",
			"resource \"google_redis_instance\" \"cache\" {\n  name           = \"cache\"\n  memory_size_gb = 1\n}\n\nresource \"google_artifact_registry_repository\" \"images\" {"}},
		want: "type google_redis_instance is in neither table",
	},
}

func init() {
	brokenCases = append(brokenCases,
		struct {
			name  string
			rule  string
			edits []edit
			want  string
		}{
			name: "the game day on by default",
			rule: "game-day-off",
			edits: []edit{{"variables.tf", "  default = null\n  validation {\n    condition     = var.game_day == null || (try(",
				"  default = { pause_ms = 150000, payout_prefix = \"gameday-\", operator = \"user:me@example.com\" }\n  validation {\n    condition     = var.game_day == null || (try("}},
			want: "game_day defaults to something other than null",
		},
		struct {
			name  string
			rule  string
			edits []edit
			want  string
		}{
			name:  "the pause fault armed without the game day",
			rule:  "game-day-off",
			edits: []edit{{"main.tf", "game_day_executor_env = local.game_day ? {", "game_day_executor_env = true ? {"}},
			want:  "EXECUTOR_FAULT_PAUSE_BEFORE_SUBMIT_MS is set outside a condition on var.game_day",
		},
		struct {
			name  string
			rule  string
			edits []edit
			want  string
		}{
			name:  "no game_day variable",
			rule:  "game-day-off",
			edits: []edit{{"variables.tf", `variable "game_day" {`, `variable "game_night" {`}, {"main.tf", "game_day = var.game_day != null", "game_day = var.game_night != null"}, {"main.tf", "tostring(var.game_day.pause_ms)", "tostring(var.game_night.pause_ms)"}, {"main.tf", "= var.game_day.payout_prefix", "= var.game_night.payout_prefix"}, {"main.tf", "{ operator = var.game_day.operator }", "{ operator = var.game_night.operator }"}, {"outputs.tf", "value       = var.game_day\n", "value       = var.game_night\n"}},
			want:  "the root module has no game_day variable",
		},
	)
}

func TestEveryRuleFailsOnABrokenCopy(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range brokenCases {
		covered[tc.rule] = true
		t.Run(tc.name, func(t *testing.T) {
			c := brokenCopy(t, tc.edits...)
			var hit bool
			for _, v := range tfpolicy.Check(c) {
				if v.Rule != tc.rule {
					t.Errorf("another rule reported too: %s", v)
					continue
				}
				if strings.Contains(v.String(), tc.want) {
					hit = true
				}
			}
			if !hit {
				t.Errorf("rule %s did not report %q on the broken copy", tc.rule, tc.want)
			}
		})
	}
	for _, r := range tfpolicy.Rules {
		if !covered[r.Name] {
			t.Errorf("rule %s has no broken case", r.Name)
		}
	}
}

func TestUnchangedCopyPasses(t *testing.T) {
	if vs := tfpolicy.Check(brokenCopy(t)); len(vs) != 0 {
		t.Errorf("the copy without edits reports %v", vs)
	}
}

func TestLoadRefusesARemoteModuleAndAnEmptyDir(t *testing.T) {
	_, err := tfpolicy.Load(t.TempDir())
	if !errors.Is(err, tfpolicy.ErrLoad) {
		t.Errorf("Load(empty dir) = %v, want ErrLoad", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte("module \"x\" {\n  source = \"hashicorp/x/google\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tfpolicy.Load(dir); !errors.Is(err, tfpolicy.ErrLoad) {
		t.Errorf("Load(registry module) = %v, want ErrLoad", err)
	}
}

func TestResourceDepsFollowsVariablesOutputsAndModuleDependsOn(t *testing.T) {
	c, err := tfpolicy.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	deps := c.ResourceDeps()
	for addr, want := range map[string][]string{
		// A reference inside the module, and the module call's depends_on.
		"module.cloudsql.google_sql_database.lockdb": {"module.cloudsql.google_sql_database_instance.lock", "module.budget.google_billing_budget.lab", "module.apis.google_project_service.this"},
		// Module variables fed from other modules' outputs.
		"module.executor.google_cloud_run_v2_service.this":       {"module.payment_resource.google_cloud_run_v2_service.this", "module.rail_proxy.google_cloud_run_v2_service.this", "module.network.google_compute_address.lock_server"},
		"module.pubsub.google_pubsub_subscription.executor_push": {"module.executor.google_cloud_run_v2_service.this", "module.pubsub.google_pubsub_topic.payouts", "module.pubsub.google_pubsub_topic.dead_letter"},
		// The budget needs only its API.
		"module.budget.google_billing_budget.lab": {"module.budget.google_project_service.billingbudgets"},
	} {
		for _, w := range want {
			if !slices.Contains(deps[addr], w) {
				t.Errorf("%s: deps %v lack %s", addr, deps[addr], w)
			}
		}
	}
	if got := deps["module.budget.google_billing_budget.lab"]; len(got) != 1 {
		t.Errorf("the budget depends on %v, want only its API", got)
	}
}
