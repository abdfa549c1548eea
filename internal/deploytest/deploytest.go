// Package deploytest reads the deployment artifacts that cannot be tried
// without a cloud account, strictly, and checks the properties a live
// deploy depends on: the Kubernetes manifests of etcd (etcd/deploy) and
// lock-server (lockserver/deploy), decoded into the Kubernetes API types
// (and Managed Service for Prometheus's PodMonitoring, declared here)
// with unknown fields refused, and cloudbuild.yaml, decoded into the
// fields of a Cloud Build config with unknown fields refused.
//
// Each Check function returns the problems it found, one sentence each;
// none means the property holds. The tests run them on the real files and
// on broken copies.
package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// ErrDecode wraps every decoding error: a document of an unknown kind, a
// field the API type does not have, a value of the wrong type.
var ErrDecode = errors.New("deploytest: cannot decode")

// Manifests are the objects of one or more manifest files, by kind.
type Manifests struct {
	Namespaces      []*corev1.Namespace
	ServiceAccounts []*corev1.ServiceAccount
	Services        []*corev1.Service
	Deployments     []*appsv1.Deployment
	StatefulSets    []*appsv1.StatefulSet
	PDBs            []*policyv1.PodDisruptionBudget
	PodMonitorings  []*PodMonitoring
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// DecodeFiles decodes every YAML document of the files into Manifests,
// strictly: a kind other than those Manifests holds, or a field unknown
// to its API type, is an error wrapping ErrDecode.
func DecodeFiles(paths ...string) (*Manifests, error) {
	m := &Manifests{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrDecode, err)
		}
		if err := m.decode(p, b); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Manifests) decode(name string, b []byte) error {
	for i, doc := range docSeparator.Split(string(b), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return fmt.Errorf("%w: %s document %d: %v", ErrDecode, name, i+1, err)
		}
		var target any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/Namespace":
			o := &corev1.Namespace{}
			m.Namespaces, target = append(m.Namespaces, o), o
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			m.ServiceAccounts, target = append(m.ServiceAccounts, o), o
		case "v1/Service":
			o := &corev1.Service{}
			m.Services, target = append(m.Services, o), o
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			m.Deployments, target = append(m.Deployments, o), o
		case "apps/v1/StatefulSet":
			o := &appsv1.StatefulSet{}
			m.StatefulSets, target = append(m.StatefulSets, o), o
		case "policy/v1/PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			m.PDBs, target = append(m.PDBs, o), o
		case "monitoring.googleapis.com/v1/PodMonitoring":
			o := &PodMonitoring{}
			m.PodMonitorings, target = append(m.PodMonitorings, o), o
		default:
			return fmt.Errorf("%w: %s document %d: kind %q of apiVersion %q is not one deploytest knows", ErrDecode, name, i+1, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			return fmt.Errorf("%w: %s document %d (%s): %v", ErrDecode, name, i+1, tm.Kind, err)
		}
	}
	return nil
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
