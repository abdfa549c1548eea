# A provider-free stand-in for terraform/ that labenv's tests drive with
# the real module's variables: the test copies terraform/variables.tf
# beside this file, so a variable the real module adds reaches this one
# too. Each resource stands for a group of the real module's and, through
# curl, creates and deletes its counterpart in the fake Google Cloud the
# test serves at $FAKE_CLOUD (unset: plan only). The outputs are the ones
# labenv reads after apply.

terraform {
  required_version = ">= 1.9.0"
}

locals {
  labels = merge({
    app        = "distributed-lock-lab"
    lab        = var.name_prefix
    managed-by = "terraform"
  }, var.labels)
  accounts = ["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler", "lock-server", "pubsub-push", "gke-nodes", "deployer"]
  sa       = { for a in local.accounts : a => "${var.name_prefix}-${a}@${var.project_id}.iam.gserviceaccount.com" }
  # The APIs module.apis enables (a few of them: those the fake serves).
  services = ["run.googleapis.com", "sqladmin.googleapis.com", "container.googleapis.com", "artifactregistry.googleapis.com",
  "compute.googleapis.com", "pubsub.googleapis.com", "cloudscheduler.googleapis.com", "iam.googleapis.com"]
}

resource "terraform_data" "budget" {
  input = { project = var.project_id, billing_account = var.billing_account, amount = var.budget_amount }
}

resource "terraform_data" "apis" {
  input      = { services = join(",", local.services) }
  depends_on = [terraform_data.budget]
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/enable?services=${self.input.services}\""
  }
}

resource "terraform_data" "service_accounts" {
  input      = { emails = join(",", values(local.sa)) }
  depends_on = [terraform_data.apis]
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/serviceaccounts?emails=${self.input.emails}\""
  }
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
  depends_on = [terraform_data.budget, terraform_data.apis, terraform_data.service_accounts]
}

# The Cloud Run services, with the keys' public halves in their
# environment as the real ones have them.
resource "terraform_data" "service" {
  for_each = toset(["rail-stub", "rail-proxy", "payment-resource", "executor", "reconciler"])
  input = {
    name   = each.key
    labels = jsonencode(local.labels)
    env = jsonencode({
      LOCK_PROOF_KEYS    = var.lock_proof_keys
      RAIL_RECEIPT_KEYS  = var.rail_receipt_keys
      PAYMENT_TERMS_KEYS = var.payment_terms_keys
      GAME_DAY           = var.game_day == null ? "" : var.game_day.payout_prefix
    })
    region = var.region
  }
  depends_on = [module.secrets, terraform_data.service_accounts]
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/run/${self.input.region}/${self.input.name}\" -d '${self.input.labels}'"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "curl -sS --fail-with-body -X DELETE \"$FAKE_CLOUD/fake/run/${self.input.region}/${self.input.name}\""
  }
}

resource "terraform_data" "sql" {
  for_each   = toset(["pay", "lock"])
  input      = { name = "${var.name_prefix}-${each.key}-a1b2", labels = jsonencode(local.labels), tier = var.sql_tier }
  depends_on = [terraform_data.apis]
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/sql/${self.input.name}\" -d '${self.input.labels}'"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "curl -sS --fail-with-body -X DELETE \"$FAKE_CLOUD/fake/sql/${self.input.name}\""
  }
}

output "service_accounts" {
  value = local.sa
}

output "pay_instance" {
  value = "${var.project_id}:${var.region}:${terraform_data.sql["pay"].input.name}"
}

output "lock_instance" {
  value = "${var.project_id}:${var.region}:${terraform_data.sql["lock"].input.name}"
}

output "gke_cluster" {
  value = "${var.name_prefix}-gke"
}

output "gke_location" {
  value = var.region
}

output "lock_server_address" {
  value = "10.10.15.10"
}

output "image_repository" {
  value = "${var.region}-docker.pkg.dev/${var.project_id}/${var.name_prefix}-images"
}

output "build_source_bucket" {
  value = "${var.project_id}-${var.name_prefix}-build"
}

output "labels" {
  value = local.labels
}

output "service_env" {
  value = { for k, s in terraform_data.service : k => jsondecode(s.input.env) }
}
