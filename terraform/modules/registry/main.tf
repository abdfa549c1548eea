# The Docker repository of every image the lab runs, with a cleanup policy
# so that old tags do not pile up storage cost, and the bucket that
# `gcloud builds submit` stages sources in (else gcloud makes one outside
# the state, which destroy would leave behind).

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

variable "writers" {
  description = "Members that push images and read staged build sources (the deployer), by a static key: for_each keys must be known at plan time, and an account's email is not until it exists."
  type        = map(string)
}

variable "readers" {
  description = "Members that pull images (GKE nodes), by a static key. Cloud Run's service agent reads the project's repositories already."
  type        = map(string)
}

resource "google_artifact_registry_repository" "images" {
  project       = var.project_id
  location      = var.region
  repository_id = "${var.name_prefix}-images"
  format        = "DOCKER"
  labels        = var.labels

  cleanup_policy_dry_run = false

  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      tag_state  = "ANY"
      older_than = "604800s"
    }
  }

  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 10
    }
  }
}

resource "google_storage_bucket" "build_source" {
  project                     = var.project_id
  name                        = "${var.project_id}-${var.name_prefix}-build-source"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = var.labels

  lifecycle_rule {
    condition {
      age = 7
    }
    action {
      type = "Delete"
    }
  }
}

resource "google_storage_bucket_iam_member" "source_reader" {
  for_each = var.writers
  bucket   = google_storage_bucket.build_source.name
  role     = "roles/storage.objectViewer"
  member   = each.value
}

resource "google_artifact_registry_repository_iam_member" "writer" {
  for_each   = var.writers
  project    = var.project_id
  location   = var.region
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = each.value
}

resource "google_artifact_registry_repository_iam_member" "reader" {
  for_each   = var.readers
  project    = var.project_id
  location   = var.region
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = each.value
}

output "build_source_bucket" {
  value = google_storage_bucket.build_source.name
}

output "url" {
  description = "Image path prefix: REGION-docker.pkg.dev/PROJECT/REPO."
  value       = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}
