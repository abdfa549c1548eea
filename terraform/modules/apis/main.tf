# The APIs the lab uses. Every resource that needs one depends on this
# module. disable_on_destroy is false: disabling an API on destroy fails
# while any dependent service still exists, and an enabled API costs
# nothing.

variable "project_id" {
  type = string
}

variable "services" {
  type = set(string)
}

resource "google_project_service" "this" {
  for_each           = var.services
  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

output "enabled" {
  value = [for s in google_project_service.this : s.service]
}
