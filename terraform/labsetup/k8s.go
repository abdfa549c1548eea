package labsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where lock-server's Deployment (lockserver/deploy/lock-server.yaml) reads
// LOCK_PROOF_SIGNING_KEY from: the key KubeSecretKey of the Secret
// KubeSecretName in namespace KubeNamespace.
const (
	KubeNamespace  = "dlock"
	KubeSecretName = "lock-proof-signing-key"
	KubeSecretKey  = "key"
)

// LockServerSecret returns the Kubernetes Secret holding lock-server's
// grant-proof key, as a JSON manifest for `kubectl apply -f -`. The key
// goes to kubectl through its standard input, never through a file or an
// argument (which other users of the machine could read in /proc).
func LockServerSecret(k fenceproof.SigningKey) ([]byte, error) {
	s := corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      KubeSecretName,
			Namespace: KubeNamespace,
			Labels:    map[string]string{"app.kubernetes.io/part-of": "distributed-lock-lab", "app.kubernetes.io/managed-by": "labenv"},
		},
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{KubeSecretKey: k.String()},
	}
	return json.Marshal(s)
}

// KubectlApply runs `kubectl apply -f -` with manifest on its standard
// input (kubectl from PATH, with the current context: labenv runs
// `gcloud container clusters get-credentials` first). kubectl's output
// goes to out; its error names the exit status only.
func KubectlApply(ctx context.Context, kubectl string, manifest []byte, out io.Writer) error {
	cmd := exec.CommandContext(ctx, kubectl, "apply", "-f", "-")
	cmd.Stdin = bytes.NewReader(manifest)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("labsetup: kubectl apply: %w", err)
	}
	return nil
}
