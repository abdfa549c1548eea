# A provider-free stand-in for terraform/: one terraform_data per concern,
# wired with the same dependencies (the budget first, everything billable
# after it), so that the lifecycle can run here without a cloud account.
# Each resource appends its name to var.trace when it is created, so a
# test can read the order of creation.

terraform {
  required_version = ">= 1.9.0"
}

variable "trace" {
  description = "File each resource appends its name to on creation."
  type        = string
}

variable "fail_at" {
  description = "Name of the resource whose creation fails (exit 1), or empty."
  type        = string
  default     = ""
}

locals {
  labels = { app = "distributed-lock-lab", lab = "fixture" }
}

resource "terraform_data" "budget" {
  input = { name = "budget" }
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "apis" {
  input      = { name = "apis" }
  depends_on = [terraform_data.budget]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "network" {
  input      = { name = "network", labels = local.labels, lock_server_address = "10.10.15.10" }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "iam" {
  input      = { name = "iam" }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "registry" {
  input      = { name = "registry", labels = local.labels, writer = terraform_data.iam.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "cloudsql" {
  input      = { name = "cloudsql", labels = local.labels, users = terraform_data.iam.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "gke" {
  input      = { name = "gke", labels = local.labels, network = terraform_data.network.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "rail_stub" {
  input      = { name = "rail_stub", uri = "https://rail-stub.example", network = terraform_data.network.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "rail_proxy" {
  input      = { name = "rail_proxy", uri = "https://rail-proxy.example", rail_url = terraform_data.rail_stub.output.uri, db = terraform_data.cloudsql.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "payment_resource" {
  input      = { name = "payment_resource", uri = "https://payment-resource.example", db = terraform_data.cloudsql.output.name }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "executor" {
  input = {
    name                 = "executor"
    uri                  = "https://executor.example"
    lock_server_url      = "http://${terraform_data.network.output.lock_server_address}"
    payment_resource_url = terraform_data.payment_resource.output.uri
    rail_proxy_url       = terraform_data.rail_proxy.output.uri
  }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

resource "terraform_data" "pubsub" {
  input      = { name = "pubsub", push_endpoint = terraform_data.executor.output.uri, audience = terraform_data.executor.output.uri }
  depends_on = [terraform_data.budget, terraform_data.apis]
  provisioner "local-exec" {
    command = "echo ${self.input.name} >> '${var.trace}' && test '${var.fail_at}' != '${self.input.name}'"
  }
}

output "service_urls" {
  value = {
    rail-stub        = terraform_data.rail_stub.output.uri
    rail-proxy       = terraform_data.rail_proxy.output.uri
    payment-resource = terraform_data.payment_resource.output.uri
    executor         = terraform_data.executor.output.uri
  }
}

output "executor_lock_server_url" {
  value = terraform_data.executor.output.lock_server_url
}
