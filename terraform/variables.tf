variable "project_id" {
  description = "The dedicated Google Cloud project of the lab (GOOGLE_CLOUD_PROJECT). Everything is created in it; destroy empties it."
  type        = string
}

variable "region" {
  description = "The one region of every regional resource (the lab is single-region by charter)."
  type        = string
  default     = "europe-west1"
}

variable "billing_account" {
  description = "Billing account id (XXXXXX-XXXXXX-XXXXXX) the budget is created on. The caller needs billing.budgets.create on it."
  type        = string
}

variable "budget_amount" {
  description = "Monthly budget, in whole units of the billing account's currency. Alerts at 50, 90 and 100 percent of actual spend and 100 percent of forecast."
  type        = number
  default     = 50
}

variable "name_prefix" {
  description = "Prefix of every resource name, so that two labs can share nothing by accident."
  type        = string
  default     = "dlock"
}

variable "labels" {
  description = "Labels put on every resource that takes labels; the zero-billable check finds leftovers by them. Merged over the defaults in main.tf."
  type        = map(string)
  default     = {}
}

variable "image_tag" {
  description = "Tag ($COMMIT_SHA) of the images in Artifact Registry. Empty: every Cloud Run service starts on Google's placeholder image until cloudbuild.yaml deploys the real one."
  type        = string
  default     = ""
}

variable "max_instances" {
  description = "Cap on instances of each Cloud Run service (cost bound). Min instances is always 0."
  type        = number
  default     = 3
}

variable "sql_tier" {
  description = "Machine tier of both Cloud SQL instances (Enterprise edition)."
  type        = string
  default     = "db-custom-1-3840"
}

variable "gke_namespace" {
  description = "Kubernetes namespace of lock-server and etcd (the Workload Identity binding names it)."
  type        = string
  default     = "dlock"
}

variable "lock_proof_keys" {
  description = "Public keys of lock-server's grant proofs (LOCK_PROOF_KEYS: comma-separated id:base64url, from lockctl proof-key), given to both fence points. Not a secret; the signing half goes to the lock-proof-signing-key secret (docs/cloud.md)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43}(,[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43})*$", var.lock_proof_keys))
    error_message = "lock_proof_keys must be one or more id:base64url public keys (lockctl proof-key prints LOCK_PROOF_KEYS=...)."
  }
}

variable "rail_receipt_keys" {
  description = "Public keys of rail-proxy's receipts (RAIL_RECEIPT_KEYS), given to payment-resource. Not a secret; the signing half goes to the rail-receipt-signing-key secret."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43}(,[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43})*$", var.rail_receipt_keys))
    error_message = "rail_receipt_keys must be one or more id:base64url public keys."
  }
}
