# The GKE Autopilot cluster of lock-server and the etcd StatefulSet, and
# lock-server's Workload Identity binding (it can only be made once the
# cluster has created the project's identity pool). The Kubernetes objects
# are plain YAML applied by cloudbuild.yaml (etcd/deploy,
# lockserver/deploy): a kubernetes provider configured from a cluster made
# in the same apply breaks destroy.

variable "project_id" {
  type = string
}

variable "region" {
  type = string
}

variable "name_prefix" {
  type = string
}

variable "labels" {
  type = map(string)
}

variable "network_id" {
  type = string
}

variable "subnetwork_id" {
  type = string
}

variable "node_service_account" {
  type = string
}

variable "lock_server_service_account_name" {
  type = string
}

variable "namespace" {
  type = string
}

resource "google_container_cluster" "lab" {
  project             = var.project_id
  name                = "${var.name_prefix}-gke"
  location            = var.region
  enable_autopilot    = true
  deletion_protection = false
  network             = var.network_id
  subnetwork          = var.subnetwork_id
  resource_labels     = var.labels

  # Secondary ranges for pods and services are allocated by GKE.
  ip_allocation_policy {}

  release_channel {
    channel = "REGULAR"
  }

  cluster_autoscaling {
    auto_provisioning_defaults {
      service_account = var.node_service_account
      oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    }
  }
}

resource "google_service_account_iam_member" "lock_server_workload_identity" {
  service_account_id = var.lock_server_service_account_name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/lock-server]"

  depends_on = [google_container_cluster.lab]
}

output "cluster_name" {
  value = google_container_cluster.lab.name
}

output "location" {
  value = google_container_cluster.lab.location
}
