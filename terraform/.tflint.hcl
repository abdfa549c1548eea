# tflint's configuration for make lint: the bundled terraform rules, as
# recommended. The Google ruleset needs a download from GitHub, so it runs
# in cloudbuild.yaml only (.tflint.google.hcl).
plugin "terraform" {
  enabled = true
  preset  = "recommended"
}
