# The lab's Google Cloud environment. Order of creation, enforced by
# dependencies rather than by file order:
#
#   budget -> apis -> (network, iam, registry, cloudsql, gke, cloud run, pubsub)
#
# Every module below the budget lists module.budget in its depends_on, so a
# plan can never create a billable resource before (or without) the
# budget. terraform/tfpolicy checks this and the other rules offline.

locals {
  labels = merge({
    app        = "distributed-lock-lab"
    lab        = var.name_prefix
    managed-by = "terraform"
  }, var.labels)

  services = toset([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "cloudscheduler.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "sqladmin.googleapis.com",
    "cloudtrace.googleapis.com",
    "telemetry.googleapis.com",
  ])

  placeholder_image = "us-docker.pkg.dev/cloudrun/container/hello"
  image = { for s in ["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler"] :
    s => var.image_tag == "" ? local.placeholder_image : "${module.registry.url}/${s}:${var.image_tag}"
  }

  # The executor's worst case for one delivery, from its defaults
  # (docs/configuration.md): acquire wait 15 s + three lease confirmations
  # and the claim and result calls at 5 s each (25 s) + the rail call 10 s
  # + release 5 s = 55 s. The ack deadline leaves twice that; the Cloud Run
  # request timeout exceeds the ack deadline, so Pub/Sub gives up first.
  ack_deadline_seconds     = 120
  executor_request_timeout = "180s"

  # The service accounts' emails, known only once they have had time to
  # propagate: every binding that names one waits for it.
  sa = time_sleep.service_accounts.triggers

  # The game day (var.game_day, off by default): the executor's pause fault
  # and the operator's access for the harness. Nothing here is set unless
  # the variable is; terraform/tfpolicy checks that it defaults to null.
  game_day = var.game_day != null
  game_day_executor_env = local.game_day ? {
    EXECUTOR_FAULT_PAUSE_BEFORE_SUBMIT_MS = tostring(var.game_day.pause_ms)
    EXECUTOR_FAULT_PAUSE_PAYOUT_PREFIX    = var.game_day.payout_prefix
  } : {}
  game_day_invokers = local.game_day ? { operator = var.game_day.operator } : {}
}

module "budget" {
  source          = "./modules/budget"
  project_id      = var.project_id
  project_number  = data.google_project.this.number
  billing_account = var.billing_account
  amount          = var.budget_amount
  display_name    = "${var.name_prefix} lab (${var.project_id})"
}

module "apis" {
  source     = "./modules/apis"
  project_id = var.project_id
  services   = local.services
  depends_on = [module.budget]
}

# Google documents that an API just enabled may answer SERVICE_DISABLED
# for a few minutes, and that a new service account may not be usable in
# a binding for about a minute. Everything that calls an API of
# local.services waits for the first; everything that names a service
# account (through local.sa) for the second. Both wait on the first apply
# only; destroy does not wait. labenv enables and awaits the APIs it calls
# itself (and the budget's) before Terraform runs, and retries an apply
# once on these errors should the waits fall short.
resource "time_sleep" "apis" {
  create_duration = "60s"
  triggers        = { services = join(",", sort(module.apis.enabled)) }
}

resource "time_sleep" "service_accounts" {
  create_duration = "60s"
  triggers        = module.iam.emails
}

# The Pub/Sub service agent is created lazily by Google; asking for its
# identity makes it exist before the dead-letter grants name it.
resource "google_project_service_identity" "pubsub" {
  provider   = google-beta
  project    = var.project_id
  service    = "pubsub.googleapis.com"
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "network" {
  source      = "./modules/network"
  name_prefix = var.name_prefix
  region      = var.region
  labels      = local.labels
  depends_on  = [module.budget, module.apis, time_sleep.apis]
}

module "iam" {
  source      = "./modules/iam"
  project_id  = var.project_id
  name_prefix = var.name_prefix
  depends_on  = [module.budget, module.apis, time_sleep.apis]
}

module "registry" {
  source      = "./modules/registry"
  project_id  = var.project_id
  region      = var.region
  name_prefix = var.name_prefix
  labels      = local.labels
  writers     = { deployer = "serviceAccount:${local.sa["deployer"]}" }
  readers     = { gke-nodes = "serviceAccount:${local.sa["gke-nodes"]}" }
  depends_on  = [module.budget, module.apis, time_sleep.apis]
}

module "cloudsql" {
  source      = "./modules/cloudsql"
  project_id  = var.project_id
  region      = var.region
  name_prefix = var.name_prefix
  tier        = var.sql_tier
  labels      = local.labels
  pay_users = {
    payment-resource = module.iam.db_users["payment-resource"]
    rail-proxy       = module.iam.db_users["rail-proxy"]
  }
  lock_users = {
    lock-server = module.iam.db_users["lock-server"]
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "gke" {
  source                           = "./modules/gke"
  project_id                       = var.project_id
  region                           = var.region
  name_prefix                      = var.name_prefix
  labels                           = local.labels
  network_id                       = module.network.network_id
  subnetwork_id                    = module.network.subnetwork_id
  node_service_account             = local.sa["gke-nodes"]
  lock_server_service_account_name = module.iam.names["lock-server"]
  namespace                        = var.gke_namespace
  control_plane_cidrs              = var.gke_control_plane_cidrs
  depends_on                       = [module.budget, module.apis, time_sleep.apis]
}

# rail-stub stands for the payment rail, a party outside the lab: its
# ingress is open to the internet, its invoker IAM is not (rail-proxy, and
# the operator's identity for the harness, which reads its record).
module "rail_stub" {
  source          = "./modules/cloudrun"
  traces_endpoint = var.traces_endpoint
  project_id      = var.project_id
  region          = var.region
  name            = "rail-stub"
  image           = local.image["rail-stub"]
  service_account = local.sa["rail-stub"]
  # One instance: its record of submissions is the judge of INV-04 and
  # lives in that instance.
  max_instances = 1
  ingress       = "INGRESS_TRAFFIC_ALL"
  network_id    = module.network.network_id
  subnetwork_id = module.network.subnetwork_id
  invokers      = merge({ rail-proxy = "serviceAccount:${local.sa["rail-proxy"]}" }, local.game_day_invokers)
  labels        = local.labels
  depends_on    = [module.budget, module.apis, time_sleep.apis]
}

module "secrets" {
  source      = "./modules/secrets"
  project_id  = var.project_id
  name_prefix = var.name_prefix
  labels      = local.labels
  readers = {
    lock-proof-signing-key    = local.sa["lock-server"]
    rail-receipt-signing-key  = local.sa["rail-proxy"]
    payment-terms-signing-key = local.sa["payment-resource"]
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "rail_proxy" {
  source          = "./modules/cloudrun"
  traces_endpoint = var.traces_endpoint
  project_id      = var.project_id
  region          = var.region
  name            = "rail-proxy"
  image           = local.image["rail-proxy"]
  service_account = local.sa["rail-proxy"]
  max_instances   = var.max_instances
  network_id      = module.network.network_id
  subnetwork_id   = module.network.subnetwork_id
  invokers = {
    executor   = "serviceAccount:${local.sa["executor"]}"
    reconciler = "serviceAccount:${local.sa["reconciler"]}"
  }
  labels = local.labels
  env = {
    RAILDB_URL         = "user=${module.iam.db_users["rail-proxy"]} dbname=raildb sslmode=disable"
    RAILDB_INSTANCE    = module.cloudsql.pay_connection_name
    RAIL_URL           = module.rail_stub.uri
    RAIL_ID_TOKENS     = "true" # rail-stub is private: each call carries an ID token
    LOCK_PROOF_KEYS    = var.lock_proof_keys
    PAYMENT_TERMS_KEYS = var.payment_terms_keys
  }
  env_refs = {
    RAIL_RECEIPT_SIGNING_KEY = module.secrets.ids["rail-receipt-signing-key"]
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "payment_resource" {
  source          = "./modules/cloudrun"
  traces_endpoint = var.traces_endpoint
  project_id      = var.project_id
  region          = var.region
  name            = "payment-resource"
  image           = local.image["payment-resource"]
  service_account = local.sa["payment-resource"]
  max_instances   = var.max_instances
  network_id      = module.network.network_id
  subnetwork_id   = module.network.subnetwork_id
  # Internal, except on a game day: the harness creates accounts and
  # payouts and reads the audit from outside the VPC, with an ID token of
  # the operator (docs/cloud.md, "How the harness reaches the services").
  ingress = local.game_day ? "INGRESS_TRAFFIC_ALL" : "INGRESS_TRAFFIC_INTERNAL_ONLY"
  invokers = merge({
    executor   = "serviceAccount:${local.sa["executor"]}"
    reconciler = "serviceAccount:${local.sa["reconciler"]}"
  }, local.game_day_invokers)
  labels = local.labels
  env = {
    PAYDB_URL         = "user=${module.iam.db_users["payment-resource"]} dbname=paydb sslmode=disable"
    PAYDB_INSTANCE    = module.cloudsql.pay_connection_name
    PUBSUB_PROJECT    = var.project_id
    PUBSUB_TOPIC      = module.pubsub.topic
    LOCK_PROOF_KEYS   = var.lock_proof_keys
    RAIL_RECEIPT_KEYS = var.rail_receipt_keys
  }
  env_refs = {
    PAYMENT_TERMS_SIGNING_KEY = module.secrets.ids["payment-terms-signing-key"]
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "executor" {
  source          = "./modules/cloudrun"
  traces_endpoint = var.traces_endpoint
  project_id      = var.project_id
  region          = var.region
  name            = "executor"
  image           = local.image["executor"]
  service_account = local.sa["executor"]
  max_instances   = var.max_instances
  request_timeout = local.executor_request_timeout
  # It calls lock-server's internal load balancer and two internal
  # services: everything leaves through the VPC.
  vpc_egress    = "ALL_TRAFFIC"
  network_id    = module.network.network_id
  subnetwork_id = module.network.subnetwork_id
  invokers      = { pubsub-push = "serviceAccount:${local.sa["pubsub-push"]}" }
  labels        = local.labels
  # A paused delivery (the game day's pause fault) must keep running after
  # Pub/Sub has hung up on its push: cpu_idle stays false (the module's
  # default, which the metrics sidecar needs on every service anyway).
  env = merge({
    LOCK_SERVER_URL      = "http://${module.network.lock_server_address}"
    PAYMENT_RESOURCE_URL = module.payment_resource.uri
    RAIL_PROXY_URL       = module.rail_proxy.uri
    EXECUTOR_ID_TOKENS   = "true" # payment-resource and rail-proxy are private
  }, local.game_day_executor_env)
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

# The reconciler settles payouts in doubt against the rail's record
# (docs/payout-pipeline.md); Cloud Scheduler runs one pass every 5 minutes,
# calling it with an OIDC token of its own service account.
module "reconciler" {
  source          = "./modules/cloudrun"
  traces_endpoint = var.traces_endpoint
  project_id      = var.project_id
  region          = var.region
  name            = "reconciler"
  image           = local.image["reconciler"]
  service_account = local.sa["reconciler"]
  max_instances   = 1
  vpc_egress      = "ALL_TRAFFIC" # lock-server's internal load balancer, two internal services
  network_id      = module.network.network_id
  subnetwork_id   = module.network.subnetwork_id
  invokers        = { scheduler = "serviceAccount:${local.sa["reconciler"]}" }
  labels          = local.labels
  env = {
    LOCK_SERVER_URL      = "http://${module.network.lock_server_address}"
    PAYMENT_RESOURCE_URL = module.payment_resource.uri
    RAIL_PROXY_URL       = module.rail_proxy.uri
    RECONCILER_ID_TOKENS = "true"
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

resource "google_cloud_scheduler_job" "reconcile" {
  project   = var.project_id
  region    = var.region
  name      = "${var.name_prefix}-reconcile"
  schedule  = "*/5 * * * *"
  time_zone = "Etc/UTC"

  http_target {
    http_method = "POST"
    uri         = "${module.reconciler.uri}/v1/reconciler/runs"
    oidc_token {
      service_account_email = local.sa["reconciler"]
      audience              = module.reconciler.uri
    }
  }
  depends_on = [module.budget, module.apis, time_sleep.apis]
}

module "pubsub" {
  source                    = "./modules/pubsub"
  project_id                = var.project_id
  name_prefix               = var.name_prefix
  labels                    = local.labels
  executor_uri              = module.executor.uri
  push_service_account      = local.sa["pubsub-push"]
  push_service_account_name = module.iam.names["pubsub-push"]
  pubsub_service_agent      = google_project_service_identity.pubsub.email
  publishers                = { payment-resource = "serviceAccount:${local.sa["payment-resource"]}" }
  ack_deadline_seconds      = local.ack_deadline_seconds
  # The push account is named here by name, not through local.sa.
  depends_on = [module.budget, module.apis, time_sleep.apis, time_sleep.service_accounts]
}

# Every alert of ops/slo.yaml as a Cloud Monitoring alert policy with a
# PromQL condition (docs/cloud.md, "Alerts on Google Cloud"), sent to the
# notification channels the user gives.
module "monitoring" {
  source                = "./modules/monitoring"
  project_id            = var.project_id
  notification_channels = var.notification_channels
  runbook_base          = var.runbook_base
  labels                = local.labels
  depends_on            = [module.budget, module.apis, time_sleep.apis]
}
