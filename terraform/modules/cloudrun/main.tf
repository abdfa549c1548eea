# One Cloud Run service (v2 API) of the payout pipeline: scales to zero,
# capped, internal ingress by default (Pub/Sub push from the same project
# counts as internal), invoker IAM always checked (only the members given
# may call it), and Direct VPC egress into the lab's subnet.

variable "project_id" {
  type = string
}

variable "region" {
  type = string
}

variable "name" {
  type = string
}

variable "image" {
  type = string
}

variable "service_account" {
  type = string
}

variable "env" {
  description = "Environment of the container (docs/configuration.md). PORT is set by Cloud Run."
  type        = map(string)
  default     = {}
}

variable "env_refs" {
  description = "Environment variables whose value Cloud Run reads from Secret Manager (latest version), by variable name: the Secret Manager secret id (a name, never a value). The service account must hold secretAccessor on each."
  type        = map(string)
  default     = {}
}

variable "max_instances" {
  type = number
}

variable "request_timeout" {
  description = "Cloud Run request timeout; for the executor it must exceed the push subscription's ack deadline."
  type        = string
  default     = "300s"
}

variable "network_id" {
  type = string
}

variable "subnetwork_id" {
  type = string
}

variable "ingress" {
  description = "INGRESS_TRAFFIC_INTERNAL_ONLY unless something outside the project must call the service."
  type        = string
  default     = "INGRESS_TRAFFIC_INTERNAL_ONLY"
}

variable "traces_endpoint" {
  description = "OTLP base URL the service exports spans to (OTEL_EXPORTER_OTLP_ENDPOINT); empty: no export."
  type        = string
  default     = ""
}

variable "vpc_egress" {
  description = "ALL_TRAFFIC for a service that calls internal-ingress services (*.run.app is internal only through the VPC, with Private Google Access); PRIVATE_RANGES_ONLY otherwise, so that the Cloud SQL connector reaches the instances' public IPs without a NAT."
  type        = string
  default     = "PRIVATE_RANGES_ONLY"
}

variable "cpu_idle" {
  description = "true: CPU only while requests are being answered (request-based billing). false (the default) keeps it between requests (instance-based), for work that outlives its request: the metrics sidecar's timed scrapes, the outbox publisher, a paused game-day delivery."
  type        = bool
  default     = false
}

variable "metrics_sidecar_image" {
  description = "Image of Google Cloud Managed Service for Prometheus' Cloud Run sidecar, which scrapes the function's /metrics on port 8080 and writes them to Cloud Monitoring."
  type        = string
  default     = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar:1.2.0"
}

variable "invokers" {
  description = "Members given roles/run.invoker on this service, by a static key."
  type        = map(string)
  default     = {}
}

variable "labels" {
  type = map(string)
}

resource "google_cloud_run_v2_service" "this" {
  project             = var.project_id
  name                = var.name
  location            = var.region
  ingress             = var.ingress
  deletion_protection = false
  labels              = var.labels

  template {
    service_account                  = var.service_account
    timeout                          = var.request_timeout
    max_instance_request_concurrency = 40
    labels                           = var.labels

    scaling {
      min_instance_count = 0
      max_instance_count = var.max_instances
    }

    vpc_access {
      network_interfaces {
        network    = var.network_id
        subnetwork = var.subnetwork_id
      }
      egress = var.vpc_egress
    }

    containers {
      # Named, so that the sidecar can wait for it and a deploy can name
      # the container whose image it changes (gcloud run deploy --container).
      name  = "app"
      image = var.image

      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = "1"
          memory = "512Mi"
        }
        cpu_idle = var.cpu_idle
        # More CPU while the instance starts (the connector's TLS, the
        # migrations): a shorter cold start for the first push of a
        # payout, billed only during the start.
        startup_cpu_boost = true
      }

      # GOOGLE_CLOUD_PROJECT: logjson links each log line inside a traced
      # request to its trace in Cloud Trace (logging.googleapis.com/trace),
      # and names the project the spans are written to. With
      # traces_endpoint on Google's Telemetry API, the service signs its
      # exports as its own account (internal/tracing).
      dynamic "env" {
        for_each = merge({ GOOGLE_CLOUD_PROJECT = var.project_id },
        var.traces_endpoint == "" ? {} : { OTEL_EXPORTER_OTLP_ENDPOINT = var.traces_endpoint }, var.env)
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = var.env_refs
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }

      # Every field stated: a startup_probe block left with only its
      # tcp_socket takes the provider's schema defaults (10 s period, 3
      # failures: 30 s), not Cloud Run's own default probe (one try of
      # 240 s). payment-resource and rail-proxy open their pool through
      # the Cloud SQL connector (instance metadata, an ephemeral
      # certificate, a TLS dial to port 3307) and run their migrations
      # before they listen; a cold instance on a first deploy gets
      # 5 s + 23 x 5 s = 120 s before Cloud Run gives up on it, half of
      # the 240 s Cloud Run allows (terraform/tfpolicy, cloud-run-startup).
      startup_probe {
        initial_delay_seconds = 5
        period_seconds        = 5
        timeout_seconds       = 3
        failure_threshold     = 23
        tcp_socket {
          port = 8080
        }
      }
    }

    # Managed Service for Prometheus' sidecar: it scrapes the function's
    # /metrics (port 8080, its default) and writes the series to Cloud
    # Monitoring, where the alert policies of module.monitoring read them.
    # It scrapes on a timer, so the instance keeps its CPU between
    # requests (cpu_idle defaults to false, docs/cloud.md).
    containers {
      name       = "collector"
      image      = var.metrics_sidecar_image
      depends_on = ["app"]
      resources {
        limits = {
          cpu    = "1"
          memory = "512Mi"
        }
        # Stated like the app's: with resources set and cpu_idle unset the
        # provider sends false, and one instance's containers must not
        # disagree about when the instance has CPU.
        cpu_idle = var.cpu_idle
      }
    }
  }

  lifecycle {
    # cloudbuild.yaml deploys new images; Terraform owns everything else.
    ignore_changes = [
      template[0].containers[0].image,
      client,
      client_version,
    ]
  }
}

resource "google_cloud_run_v2_service_iam_member" "invoker" {
  for_each = var.invokers
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.this.name
  role     = "roles/run.invoker"
  member   = each.value
}

output "uri" {
  value = google_cloud_run_v2_service.this.uri
}

output "name" {
  value = google_cloud_run_v2_service.this.name
}
