// Package docsite is the documentation site: mkdocs.yml and hooks.py
// build README.md, SECURITY.md, harness/README.md and docs/ into one
// searchable site (make docs, make docs-serve; docs/tooling.md says how it
// is built and checked). Its test builds the site and reads it in a
// headless Chromium.
package docsite
