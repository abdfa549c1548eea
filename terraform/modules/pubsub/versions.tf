# The versions this module is written for; the root module
# (terraform/versions.tf) pins the same majors.
terraform {
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 7.0"
    }
  }
}
