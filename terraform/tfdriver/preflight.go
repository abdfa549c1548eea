package tfdriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrMissingCredentials: what a run against Google Cloud needs is not
// there. The message names every missing piece on one line.
var ErrMissingCredentials = errors.New("tfdriver: missing")

// Environment variables Preflight reads.
const (
	// EnvProject names the lab's dedicated project.
	EnvProject = "GOOGLE_CLOUD_PROJECT"
	// EnvBillingAccount is the billing account id the budget is made on.
	EnvBillingAccount = "BILLING_ACCOUNT"
	// EnvRegion is the region (default the module's, europe-west1).
	EnvRegion = "GOOGLE_CLOUD_REGION"
)

// CloudVars are the root module's variables read from the environment.
type CloudVars struct {
	Project, BillingAccount, Region string
}

// Map returns the -var assignments of the real module (terraform/).
func (v CloudVars) Map() map[string]string {
	m := map[string]string{"project_id": v.Project, "billing_account": v.BillingAccount}
	if v.Region != "" {
		m["region"] = v.Region
	}
	return m
}

// Preflight checks, before terraform or any Google API is called, that
// the project, the billing account and Application Default Credentials
// are there: GOOGLE_CLOUD_PROJECT, BILLING_ACCOUNT (or
// TF_VAR_billing_account), and the file of GOOGLE_APPLICATION_CREDENTIALS
// or of `gcloud auth application-default login` (in CLOUDSDK_CONFIG or
// ~/.config/gcloud). getenv and exists are os.Getenv and a file test in
// production. The error wraps ErrMissingCredentials and names everything
// missing in one line.
func Preflight(getenv func(string) string, exists func(path string) bool) (CloudVars, error) {
	v := CloudVars{
		Project:        getenv(EnvProject),
		BillingAccount: getenv(EnvBillingAccount),
		Region:         getenv(EnvRegion),
	}
	if v.BillingAccount == "" {
		v.BillingAccount = getenv("TF_VAR_billing_account")
	}
	var missing []string
	if v.Project == "" {
		missing = append(missing, EnvProject+" (the lab's dedicated project id)")
	}
	if v.BillingAccount == "" {
		missing = append(missing, EnvBillingAccount+" (the billing account id the budget is created on)")
	}
	if !hasADC(getenv, exists) {
		missing = append(missing, "Application Default Credentials (run: gcloud auth application-default login)")
	}
	if len(missing) > 0 {
		return v, fmt.Errorf("%w %s", ErrMissingCredentials, strings.Join(missing, ", "))
	}
	return v, nil
}

func hasADC(getenv func(string) string, exists func(string) bool) bool {
	if p := getenv("GOOGLE_APPLICATION_CREDENTIALS"); p != "" {
		return exists(p)
	}
	dir := getenv("CLOUDSDK_CONFIG")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			return false
		}
		dir = filepath.Join(home, ".config", "gcloud")
	}
	return exists(filepath.Join(dir, "application_default_credentials.json"))
}

// FileExists reports whether path names a regular file (Preflight's
// exists in production).
func FileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
