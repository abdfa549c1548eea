# Both providers bill API quota to the lab project and send user
# credentials' requests there (billing_project + user_project_override):
# the Billing Budget API refuses user credentials without a quota project.
provider "google" {
  project               = var.project_id
  region                = var.region
  billing_project       = var.project_id
  user_project_override = true
}

provider "google-beta" {
  project               = var.project_id
  region                = var.region
  billing_project       = var.project_id
  user_project_override = true
}

data "google_project" "this" {
  project_id = var.project_id
}
