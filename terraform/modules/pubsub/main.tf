# The payout topic, the push subscription that delivers each event to the
# executor, and the dead-letter topic with a pull subscription that keeps
# what could not be delivered.

variable "project_id" {
  type = string
}

variable "name_prefix" {
  type = string
}

variable "labels" {
  type = map(string)
}

variable "executor_uri" {
  description = "The executor's Cloud Run URL: the push endpoint and the OIDC audience."
  type        = string
}

variable "push_service_account" {
  description = "Email of the push identity (holds run.invoker on the executor)."
  type        = string
}

variable "push_service_account_name" {
  description = "Resource name of the push identity (projects/.../serviceAccounts/...)."
  type        = string
}

variable "pubsub_service_agent" {
  description = "Email of the project's Pub/Sub service agent (service-NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com)."
  type        = string
}

variable "publishers" {
  description = "Members that publish payout events (payment-resource's outbox), by a static key."
  type        = map(string)
}

variable "ack_deadline_seconds" {
  description = "Must exceed the executor's worst case for one delivery (see main.tf)."
  type        = number
}

resource "google_pubsub_topic" "payouts" {
  project = var.project_id
  name    = "${var.name_prefix}-payouts"
  labels  = var.labels
}

resource "google_pubsub_topic" "dead_letter" {
  project = var.project_id
  name    = "${var.name_prefix}-payouts-dead-letter"
  labels  = var.labels
}

resource "google_pubsub_subscription" "executor_push" {
  project                 = var.project_id
  name                    = "${var.name_prefix}-payouts-executor"
  topic                   = google_pubsub_topic.payouts.id
  labels                  = var.labels
  ack_deadline_seconds    = var.ack_deadline_seconds
  enable_message_ordering = true

  push_config {
    push_endpoint = var.executor_uri

    oidc_token {
      service_account_email = var.push_service_account
      audience              = var.executor_uri
    }
  }

  retry_policy {
    minimum_backoff = "5s"
    maximum_backoff = "300s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = 10
  }

  # Without this an idle subscription is deleted after 31 days.
  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "dead_letter" {
  project                    = var.project_id
  name                       = "${var.name_prefix}-payouts-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  labels                     = var.labels
  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"

  expiration_policy {
    ttl = ""
  }
}

# Dead-lettering: the Pub/Sub service agent forwards from the source
# subscription (subscriber) to the dead-letter topic (publisher).
resource "google_pubsub_topic_iam_member" "agent_publishes_dead_letter" {
  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${var.pubsub_service_agent}"
}

resource "google_pubsub_subscription_iam_member" "agent_subscribes_source" {
  project      = var.project_id
  subscription = google_pubsub_subscription.executor_push.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${var.pubsub_service_agent}"
}

# The service agent mints the push identity's OIDC tokens. Projects made
# after April 2021 do not need this grant; it is scoped to the one account.
resource "google_service_account_iam_member" "agent_mints_push_tokens" {
  service_account_id = var.push_service_account_name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${var.pubsub_service_agent}"
}

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = var.publishers
  project  = var.project_id
  topic    = google_pubsub_topic.payouts.name
  role     = "roles/pubsub.publisher"
  member   = each.value
}

output "topic" {
  value = google_pubsub_topic.payouts.name
}

output "subscription" {
  value = google_pubsub_subscription.executor_push.name
}

output "dead_letter_subscription" {
  value = google_pubsub_subscription.dead_letter.name
}
