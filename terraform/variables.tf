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

variable "notification_channels" {
  description = "Cloud Monitoring notification channels every alert of ops/slo.yaml is sent to, as ids (projects/PROJECT/notificationChannels/N: gcloud beta monitoring channels list). Empty (the default): incidents open in Cloud Monitoring and page nobody."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for c in var.notification_channels : can(regex("^projects/[^/]+/notificationChannels/[0-9]+$", c))])
    error_message = "notification_channels must be ids of the form projects/PROJECT/notificationChannels/NUMBER."
  }
}

variable "runbook_base" {
  description = "Prefixed to each runbook's path (docs/runbooks/x.md) in the alerts' documentation: where the on-call person reads this repository."
  type        = string
  default     = "https://github.com/distributed-lock-lab/distributed-lock-lab/blob/main/"
}

variable "gke_control_plane_cidrs" {
  description = "CIDR ranges (your workstation's, e.g. [\"203.0.113.7/32\"]) allowed to reach the GKE control plane besides Google Cloud's own addresses, which Cloud Build deploys from. Empty (the default): any address, guarded by IAM and RBAC only."
  type        = list(string)
  default     = []
}

variable "lock_proof_keys" {
  description = "Public keys of lock-server's grant proofs (LOCK_PROOF_KEYS: comma-separated id:base64url, from lockctl proof-key), given to both fence points. Not a secret; labenv deploy sets it from the lock-proof-signing-key secret (docs/cloud.md)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43}(,[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43})*$", var.lock_proof_keys))
    error_message = "lock_proof_keys must be one or more id:base64url public keys (lockctl proof-key prints LOCK_PROOF_KEYS=...)."
  }
}

variable "rail_receipt_keys" {
  description = "Public keys of rail-proxy's receipts (RAIL_RECEIPT_KEYS), given to payment-resource. Not a secret; labenv deploy sets it from the rail-receipt-signing-key secret (docs/cloud.md)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43}(,[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43})*$", var.rail_receipt_keys))
    error_message = "rail_receipt_keys must be one or more id:base64url public keys."
  }
}

variable "payment_terms_keys" {
  description = "Public keys of payment-resource's payout-terms signatures (PAYMENT_TERMS_KEYS), given to rail-proxy, which forwards only terms payment-resource signed. Not a secret; labenv deploy sets it from the payment-terms-signing-key secret (docs/cloud.md)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43}(,[A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]{43})*$", var.payment_terms_keys))
    error_message = "payment_terms_keys must be one or more id:base64url public keys."
  }
}

variable "game_day" {
  description = <<-EOT
    The game day of the fencing experiment (docs/cloud.md), null (the default) for none. When set:
    the executor's pause fault is armed (EXECUTOR_FAULT_PAUSE_BEFORE_SUBMIT_MS = pause_ms for delivery 1
    of the payouts whose id starts with payout_prefix), the executor keeps its CPU between requests (the
    paused delivery carries on after Pub/Sub gives up on its push), and the operator (a member such as
    "user:me@example.com") may invoke payment-resource and rail-stub, payment-resource's ingress being
    opened to all traffic so that the harness, outside the VPC, reaches it with an ID token (invoker IAM
    still refuses everyone else). pause_ms must exceed the push ack deadline (120 s) plus the minimum
    backoff (5 s), so that Pub/Sub redelivers during the pause, and end before the executor's request
    timeout (180 s).
  EOT
  type = object({
    pause_ms      = number
    payout_prefix = string
    operator      = string
  })
  default = null
  validation {
    condition     = var.game_day == null || (try(var.game_day.pause_ms, 0) >= 135000 && try(var.game_day.pause_ms, 0) <= 165000)
    error_message = "game_day.pause_ms must be 135000..165000: above the ack deadline (120 s) and the minimum backoff (5 s) with 10 s for the redelivery, and 15 s before the executor's request timeout (180 s)."
  }
  validation {
    condition     = var.game_day == null || can(regex("^[a-z][a-z0-9-]{2,30}$", try(var.game_day.payout_prefix, "")))
    error_message = "game_day.payout_prefix must be 3..31 lower-case letters, digits or dashes, starting with a letter."
  }
  validation {
    condition     = var.game_day == null || can(regex("^(user|serviceAccount):[^@]+@[^@]+$", try(var.game_day.operator, "")))
    error_message = "game_day.operator must be one user: or serviceAccount: member, never a public one."
  }
}

variable "traces_endpoint" {
  description = "OTLP base URL every service exports its spans to. The default is Google's Telemetry API (Cloud Trace), which the services sign with their own accounts; empty turns the export off."
  type        = string
  default     = "https://telemetry.googleapis.com"
}
