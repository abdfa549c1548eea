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

variable "control_plane_cidrs" {
  description = "CIDR ranges allowed to reach the control plane, besides Google Cloud's own addresses (Cloud Build). Empty: any address, with IAM and RBAC as the only guard."
  type        = list(string)
  default     = []
}

# Autopilot decides what these tfsec findings check, and none of the
# fields they read may be set on an Autopilot cluster:
# - enforce-pod-security-policy: Kubernetes removed PodSecurityPolicy in
#   1.25; Autopilot enforces its own pod security rules instead.
# - metadata-endpoints-disabled: every Autopilot node runs the GKE
#   metadata server (Workload Identity); the legacy endpoints are off.
# - enable-network-policy: Dataplane V2 always enforces network policy.
# - use-service-account: nodes run as node_service_account, set in
#   auto_provisioning_defaults below, the Autopilot place for it.
# - enable-private-cluster: public nodes accept no inbound traffic
#   (GKE's firewall); they give the Auth Proxy its way to Cloud SQL's
#   public address, and image pulls, without a Cloud NAT billed by the
#   hour.
# - enable-master-networks: the control plane is open to every address
#   unless control_plane_cidrs is set, since the deploy reaches it from
#   the user's machine (labenv) and from Cloud Build, neither with a fixed
#   address; IAM and RBAC still guard it.
# tfsec:ignore:google-gke-enforce-pod-security-policy
# tfsec:ignore:google-gke-metadata-endpoints-disabled
# tfsec:ignore:google-gke-enable-network-policy
# tfsec:ignore:google-gke-use-service-account
# tfsec:ignore:google-gke-enable-private-cluster
# tfsec:ignore:google-gke-enable-master-networks
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

  # Managed Service for Prometheus' collection (on by default on
  # Autopilot, said here because the PodMonitoring resources of
  # etcd/deploy and lockserver/deploy need it).
  monitoring_config {
    managed_prometheus {
      enabled = true
    }
  }

  dynamic "master_authorized_networks_config" {
    for_each = length(var.control_plane_cidrs) > 0 ? [1] : []
    content {
      # Cloud Build's default pool has Google Cloud addresses.
      gcp_public_cidrs_access_enabled = true
      dynamic "cidr_blocks" {
        for_each = var.control_plane_cidrs
        iterator = cidr
        content {
          cidr_block = cidr.value
        }
      }
    }
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
