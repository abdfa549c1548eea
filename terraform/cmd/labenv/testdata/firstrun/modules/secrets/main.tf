# The secrets module's stand-in: each secret, and its reader's binding,
# which Google refuses while the reader's service account is too new.

variable "project_id" {
  type = string
}

variable "name_prefix" {
  type = string
}

variable "labels" {
  type = map(string)
}

variable "readers" {
  type = map(string)
}

resource "terraform_data" "secret" {
  for_each = var.readers
  input    = { id = "${var.name_prefix}-${each.key}", project = var.project_id, labels = jsonencode(var.labels) }
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/secrets/${self.input.project}/${self.input.id}\" -d '${self.input.labels}'"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "curl -sS --fail-with-body -X DELETE \"$FAKE_CLOUD/fake/secrets/${self.input.project}/${self.input.id}\""
  }
}

resource "terraform_data" "reader" {
  for_each = var.readers
  input    = { secret = terraform_data.secret[each.key].input.id, member = each.value }
  provisioner "local-exec" {
    command = "curl -sS --fail-with-body -X POST \"$FAKE_CLOUD/fake/bind?member=${self.input.member}\""
  }
}

output "ids" {
  value = { for k, s in terraform_data.secret : k => s.input.id }
}
