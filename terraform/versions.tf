# Terraform and provider versions. The google and google-beta providers are
# pinned to one major version: a new major changes defaults (deletion
# protection, disable_on_destroy) that destroy relies on. Run
# `terraform init` once with network access to write .terraform.lock.hcl,
# and commit it.
terraform {
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 7.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "~> 7.0"
    }
    time = {
      source  = "hashicorp/time"
      version = "~> 0.12"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}
