# tflint's configuration in cloudbuild.yaml: the bundled terraform rules and
# Google's ruleset (machine types, regions, enum values), which tflint
# --init downloads from GitHub; make lint, offline, uses .tflint.hcl.
plugin "terraform" {
  enabled = true
  preset  = "recommended"
}

plugin "google" {
  enabled = true
  version = "0.30.0"
  source  = "github.com/terraform-linters/tflint-ruleset-google"
}
