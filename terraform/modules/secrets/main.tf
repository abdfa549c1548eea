# The three signing keys of the lab, as Secret Manager secrets. Terraform
# creates the secrets and who may read them, never a version: labenv deploy
# makes the keys and adds them as versions (terraform/labsetup), so no
# secret ever enters the Terraform state.
#
#   lock-proof-signing-key    lock-server's grant-proof key (LOCK_PROOF_SIGNING_KEY),
#                             read by lock-server's service account
#   rail-receipt-signing-key  rail-proxy's receipt key (RAIL_RECEIPT_SIGNING_KEY),
#                             read by rail-proxy's service account
#   payment-terms-signing-key payment-resource's payout-terms key
#                             (PAYMENT_TERMS_SIGNING_KEY), read by
#                             payment-resource's service account
#
# Their public halves are not secrets: they are plain variables of the root
# module (lock_proof_keys, rail_receipt_keys, payment_terms_keys).

variable "project_id" {
  type = string
}

variable "name_prefix" {
  type = string
}

variable "labels" {
  type = map(string)
}

variable "readers" {
  description = "Service account email that may read each secret, by secret name."
  type        = map(string)
}

resource "google_secret_manager_secret" "this" {
  for_each  = var.readers
  project   = var.project_id
  secret_id = "${var.name_prefix}-${each.key}"
  labels    = var.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_iam_member" "reader" {
  for_each  = var.readers
  project   = var.project_id
  secret_id = google_secret_manager_secret.this[each.key].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${each.value}"
}

output "ids" {
  description = "Secret id (name within the project) by secret name."
  value       = { for k, s in google_secret_manager_secret.this : k => s.secret_id }
}
