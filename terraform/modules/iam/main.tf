# One service account per service, and the project-level roles each one
# needs (docs/cloud.md says why). Grants on one resource (a Cloud Run
# service, a topic, the registry) are made beside that resource, so that
# no account holds a role on more than it uses.

variable "project_id" {
  type = string
}

variable "name_prefix" {
  type = string
}

locals {
  accounts = {
    rail-stub        = "rail-stub: the fictional payment rail (no Google API but Cloud Trace)"
    rail-proxy       = "rail-proxy: fence point two, raildb over the Cloud SQL connector"
    payment-resource = "payment-resource: fence point one, paydb over the Cloud SQL connector, publishes payout events"
    executor         = "executor: runs payouts pushed by Pub/Sub, calls payment-resource and rail-proxy"
    reconciler       = "reconciler: settles payouts in doubt against the rail's record; also the OIDC identity of its Scheduler job"
    pubsub-push      = "pubsub-push: the OIDC identity of the push subscription (run.invoker on the executor only)"
    lock-server      = "lock-server on GKE (Workload Identity): lockdb over the Cloud SQL Auth Proxy"
    gke-nodes        = "GKE Autopilot nodes: logs, metrics, image pulls"
    deployer         = "cloudbuild.yaml: builds images, deploys Cloud Run revisions and GKE manifests"
  }

  # Project-level roles. Cloud SQL roles cannot be scoped to one instance
  # without IAM conditions; the project holds only the lab's instances.
  project_roles = {
    "rail-proxy/cloudsql.client"                    = { account = "rail-proxy", role = "roles/cloudsql.client" }
    "rail-proxy/cloudsql.instanceUser"              = { account = "rail-proxy", role = "roles/cloudsql.instanceUser" }
    "payment-resource/cloudsql.client"              = { account = "payment-resource", role = "roles/cloudsql.client" }
    "payment-resource/cloudsql.instanceUser"        = { account = "payment-resource", role = "roles/cloudsql.instanceUser" }
    "lock-server/cloudsql.client"                   = { account = "lock-server", role = "roles/cloudsql.client" }
    "lock-server/cloudsql.instanceUser"             = { account = "lock-server", role = "roles/cloudsql.instanceUser" }
    "gke-nodes/container.defaultNodeServiceAccount" = { account = "gke-nodes", role = "roles/container.defaultNodeServiceAccount" }
    "deployer/run.developer"                        = { account = "deployer", role = "roles/run.developer" }
    "deployer/container.developer"                  = { account = "deployer", role = "roles/container.developer" }
    "deployer/logging.logWriter"                    = { account = "deployer", role = "roles/logging.logWriter" }
  }

  # Every traced service writes its spans to Cloud Trace through the
  # Telemetry API's OTLP endpoint (docs/tracing.md).
  traced = ["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler", "lock-server"]
  # Each Cloud Run service's managed Prometheus sidecar writes the
  # function's /metrics to Cloud Monitoring as the service's account.
  scraped = ["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler"]
  roles = merge(local.project_roles, {
    for a in local.traced : "${a}/telemetry.tracesWriter" => { account = a, role = "roles/telemetry.tracesWriter" }
    }, {
    for a in local.scraped : "${a}/monitoring.metricWriter" => { account = a, role = "roles/monitoring.metricWriter" }
  })

  # The deployer sets these accounts as the identity of what it deploys.
  deployed_as = ["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler"]
}

resource "google_service_account" "this" {
  for_each     = local.accounts
  project      = var.project_id
  account_id   = "${var.name_prefix}-${each.key}"
  display_name = each.value
}

resource "google_project_iam_member" "this" {
  for_each = local.roles
  project  = var.project_id
  role     = each.value.role
  member   = "serviceAccount:${google_service_account.this[each.value.account].email}"
}

resource "google_service_account_iam_member" "deployer_acts_as" {
  for_each           = toset(local.deployed_as)
  service_account_id = google_service_account.this[each.value].name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.this["deployer"].email}"
}

output "emails" {
  description = "Service account emails by service name."
  value       = { for k, sa in google_service_account.this : k => sa.email }
}

output "names" {
  description = "Service account resource names (projects/.../serviceAccounts/...) by service name."
  value       = { for k, sa in google_service_account.this : k => sa.name }
}

output "db_users" {
  description = "Cloud SQL IAM database user names: the email without .gserviceaccount.com."
  value       = { for k, sa in google_service_account.this : k => trimsuffix(sa.email, ".gserviceaccount.com") }
}
