package deploytest

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// CloudBuild is the part of the Cloud Build config schema the lab uses
// (cloud.google.com/build/docs/build-config-file-schema). Decoding is
// strict: a misspelt key is an error, not a silently ignored step.
type CloudBuild struct {
	Steps          []BuildStep       `json:"steps"`
	Images         []string          `json:"images,omitempty"`
	Substitutions  map[string]string `json:"substitutions,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	Options        map[string]any    `json:"options,omitempty"`
	Timeout        string            `json:"timeout,omitempty"`
}

// BuildStep is one step of a Cloud Build config.
type BuildStep struct {
	ID         string   `json:"id,omitempty"`
	Name       string   `json:"name"`
	Entrypoint string   `json:"entrypoint,omitempty"`
	Args       []string `json:"args,omitempty"`
	Env        []string `json:"env,omitempty"`
	Dir        string   `json:"dir,omitempty"`
	WaitFor    []string `json:"waitFor,omitempty"`
	Timeout    string   `json:"timeout,omitempty"`
}

// LoadCloudBuild decodes a Cloud Build config strictly. The error wraps
// ErrDecode.
func LoadCloudBuild(path string) (*CloudBuild, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	var cb CloudBuild
	if err := yaml.UnmarshalStrict(b, &cb); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDecode, path, err)
	}
	return &cb, nil
}

// Functions returns the names of the directories under dir (functions/cmd):
// one deployable function each, FrameworkRunner aside.
func Functions(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != FrameworkRunner {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// FrameworkRunner is the one directory of functions/cmd that is not a
// deployed function: it serves any of them through functions-framework-go
// on a developer's machine.
const FrameworkRunner = "framework"

// CommitTag is the tag every image of the build carries.
const CommitTag = ":$COMMIT_SHA"

// CheckCloudBuild checks that every function in functions has a step that
// builds functions/cmd/<name> into an image tagged CommitTag and a step
// that deploys that image to the Cloud Run service <name>; that
// lock-server is built the same way; that the GKE manifests are applied;
// that every image the build names (-t, --image, images) is tagged
// CommitTag; and that steps wait only for steps that exist.
func CheckCloudBuild(cb *CloudBuild, functions []string) []string {
	var out []string
	ids := map[string]bool{"-": true}
	for _, s := range cb.Steps {
		if s.ID != "" {
			ids[s.ID] = true
		}
	}
	builds := map[string]string{}  // cmd path -> image
	deploys := map[string]string{} // service -> image
	var scripts []string
	for _, s := range cb.Steps {
		for _, w := range s.WaitFor {
			if !ids[w] {
				out = append(out, fmt.Sprintf("step %q waits for %q, which is no step id", s.ID, w))
			}
		}
		a := s.Args
		for i := 0; i < len(a); i++ {
			switch {
			case a[i] == "-t" && i+1 < len(a):
				if !strings.HasSuffix(a[i+1], CommitTag) {
					out = append(out, fmt.Sprintf("step %q tags image %q, not with %s", s.ID, a[i+1], CommitTag))
				}
			case a[i] == "--image" && i+1 < len(a):
				if !strings.HasSuffix(a[i+1], CommitTag) {
					out = append(out, fmt.Sprintf("step %q deploys image %q, not tagged %s", s.ID, a[i+1], CommitTag))
				}
			}
		}
		if len(a) > 0 && a[0] == "build" {
			var cmd, tag string
			for i := 0; i+1 < len(a); i++ {
				if a[i] == "--build-arg" && strings.HasPrefix(a[i+1], "CMD=") {
					cmd = strings.TrimPrefix(a[i+1], "CMD=")
				}
				if a[i] == "-t" {
					tag = a[i+1]
				}
			}
			if cmd != "" {
				builds[cmd] = tag
			}
		}
		if len(a) >= 3 && a[0] == "run" && a[1] == "deploy" {
			img := ""
			for i := 0; i+1 < len(a); i++ {
				if a[i] == "--image" {
					img = a[i+1]
				}
			}
			deploys[a[2]] = img
		}
		scripts = append(scripts, strings.Join(a, " "))
	}
	for _, fn := range functions {
		tag, built := builds["functions/cmd/"+fn]
		if !built {
			out = append(out, fmt.Sprintf("function %s: no step builds functions/cmd/%s", fn, fn))
		}
		img, deployed := deploys[fn]
		switch {
		case !deployed:
			out = append(out, fmt.Sprintf("function %s: no `gcloud run deploy %s` step", fn, fn))
		case built && img != tag:
			out = append(out, fmt.Sprintf("function %s: deploys %q, not the image it built (%q)", fn, img, tag))
		}
	}
	if _, ok := builds["lockserver/cmd/lock-server"]; !ok {
		out = append(out, "no step builds lockserver/cmd/lock-server")
	}
	all := strings.Join(scripts, "\n")
	for _, f := range []string{"lockserver/deploy/namespace.yaml", "etcd/deploy/etcd.yaml", "lockserver/deploy/lock-server.yaml"} {
		if !strings.Contains(all, f) {
			out = append(out, "no step applies "+f)
		}
	}
	for _, img := range cb.Images {
		if !strings.HasSuffix(img, CommitTag) {
			out = append(out, fmt.Sprintf("images: %q is not tagged %s", img, CommitTag))
		}
	}
	return out
}

// BuildMargin is what a build's timeout must leave, beyond the rollout
// waits its steps state, for the validation, the offline checks, six Go
// builds, the pushes and the Cloud Run deploys.
const BuildMargin = 30 * time.Minute

var rolloutTimeout = regexp.MustCompile(`--timeout=(\S+)`)

// CheckBuildLimits checks what Cloud Build would otherwise choose: the
// build states its timeout (Cloud Build's default is documented as 10
// minutes in older texts and 60 in the API reference; a GKE rollout
// alone may wait 20 here), long enough for every --timeout= its steps
// give kubectl plus BuildMargin, and a machineType (the default pool's
// machine has 2 vCPUs for six Go builds in parallel).
func CheckBuildLimits(cb *CloudBuild) []string {
	var out []string
	var waits time.Duration
	for _, s := range cb.Steps {
		for _, m := range rolloutTimeout.FindAllStringSubmatch(strings.Join(s.Args, " "), -1) {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				out = append(out, fmt.Sprintf("step %q: --timeout=%s is not a duration", s.ID, m[1]))
				continue
			}
			waits += d
		}
	}
	switch d, err := time.ParseDuration(cb.Timeout); {
	case cb.Timeout == "":
		out = append(out, "the build states no timeout: Cloud Build's default applies")
	case err != nil:
		out = append(out, fmt.Sprintf("timeout %q is not a duration", cb.Timeout))
	case d < waits+BuildMargin:
		out = append(out, fmt.Sprintf("timeout %s is less than the steps' rollout waits (%s) plus %s", d, waits, BuildMargin))
	}
	if mt, _ := cb.Options["machineType"].(string); mt == "" {
		out = append(out, "options.machineType is not set: the default pool's 2 vCPUs build six images at once")
	}
	return out
}
