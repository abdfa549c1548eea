# The alerts of ops/slo.yaml on Google Cloud: one Cloud Monitoring alert
# policy per alert and severity, with a PromQL condition over what
# Managed Service for Prometheus collects (lock-server and etcd through
# PodMonitoring, the functions through Cloud Run's managed Prometheus
# sidecar) and Google's own metrics. alerts.tf is generated from the spec
# (go generate ./ops/slo); docs/cloud.md says why alert policies rather
# than the managed rule evaluator.

variable "project_id" {
  type = string
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channel ids (projects/P/notificationChannels/N) every alert is sent to. Empty: incidents open in Cloud Monitoring and notify nobody."
  type        = list(string)
}

variable "runbook_base" {
  description = "Prefixed to each runbook's path from the repository root (docs/runbooks/x.md) in the alert's documentation."
  type        = string
}

variable "labels" {
  type = map(string)
}
