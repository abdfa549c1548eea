# One VPC and one subnet: GKE Autopilot's nodes and pods live in it, and
# the Cloud Run services reach lock-server's internal load balancer over
# Direct VPC egress through it. lock-server's internal address is
# reserved here, so that the executor's LOCK_SERVER_URL is known before
# the Kubernetes Service exists.

variable "name_prefix" {
  type = string
}

variable "region" {
  type = string
}

variable "labels" {
  type = map(string)
}

resource "google_compute_network" "lab" {
  name                    = "${var.name_prefix}-vpc"
  auto_create_subnetworks = false
}

# No VPC flow logs: every flow the lab has is between its own services,
# whose requests are already logged and traced, and flow logs bill by the
# gigabyte of log written.
# tfsec:ignore:google-compute-enable-vpc-flow-logs
resource "google_compute_subnetwork" "lab" {
  name                     = "${var.name_prefix}-${var.region}"
  region                   = var.region
  network                  = google_compute_network.lab.id
  ip_cidr_range            = "10.10.0.0/20"
  private_ip_google_access = true
}

resource "google_compute_address" "lock_server" {
  name         = "${var.name_prefix}-lock-server"
  region       = var.region
  subnetwork   = google_compute_subnetwork.lab.id
  address_type = "INTERNAL"
  address      = "10.10.15.10"
  labels       = var.labels
}

output "network_id" {
  value = google_compute_network.lab.id
}

output "subnetwork_id" {
  value = google_compute_subnetwork.lab.id
}

output "lock_server_address" {
  value = google_compute_address.lock_server.address
}

output "lock_server_address_name" {
  value = google_compute_address.lock_server.name
}
