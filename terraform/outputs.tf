# What the deploy step and the harness read. No output carries a secret:
# databases are reached with IAM authentication, there is no password.

output "service_urls" {
  description = "Cloud Run URLs by service name."
  value = {
    rail-stub        = module.rail_stub.uri
    rail-proxy       = module.rail_proxy.uri
    payment-resource = module.payment_resource.uri
    executor         = module.executor.uri
  }
}

output "payout_topic" {
  value = module.pubsub.topic
}

output "payout_subscription" {
  value = module.pubsub.subscription
}

output "dead_letter_subscription" {
  value = module.pubsub.dead_letter_subscription
}

output "pay_instance" {
  description = "Connection name (project:region:instance) of the instance of paydb and raildb."
  value       = module.cloudsql.pay_connection_name
}

output "lock_instance" {
  description = "Connection name of lockdb's REGIONAL instance."
  value       = module.cloudsql.lock_connection_name
}

output "gke_cluster" {
  value = module.gke.cluster_name
}

output "gke_location" {
  value = module.gke.location
}

output "lock_server_address" {
  description = "Reserved internal IP of lock-server's internal load balancer (lockserver/deploy)."
  value       = module.network.lock_server_address
}

output "lock_server_address_name" {
  value = module.network.lock_server_address_name
}

output "image_repository" {
  value = module.registry.url
}

output "build_source_bucket" {
  description = "Where gcloud builds submit stages the sources (--gcs-source-staging-dir)."
  value       = module.registry.build_source_bucket
}

output "service_accounts" {
  value = module.iam.emails
}

output "labels" {
  description = "The labels every labelled resource carries: the zero-billable check looks for them."
  value       = local.labels
}

output "game_day" {
  description = "The game day's settings (null when var.game_day is): the harness reads the payout prefix and the pause from here."
  value       = var.game_day
}
