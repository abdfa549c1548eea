// Package labsetup makes what a fresh Google Cloud project needs once and
// Terraform must not hold: the secret halves of the lab's signing keys (as
// Secret Manager versions, so that no key enters the Terraform state or a
// file), lock-server's Kubernetes Secret, and each service's right to
// create its tables in its database. `labenv deploy` runs these steps
// around terraform apply (docs/cloud.md, "What labenv deploy does"); each
// is idempotent, so every deploy runs them.
package labsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/bootstrap"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Key is one signing key of the lab: its secret half is the latest version
// of a Secret Manager secret (made by terraform/modules/secrets), its
// public half the value of a root-module variable.
type Key struct {
	// Secret is the key's name in terraform/modules/secrets; its secret id
	// in the project is "<name_prefix>-<Secret>".
	Secret string
	// Var is the root-module variable that carries the public half(s),
	// "id:base64url" separated by commas (fenceproof.ParseKeyring).
	Var string
	// IDPrefix starts the id of a key labsetup makes: IDPrefix, a dash and
	// the UTC time as 20061231-150405 (fenceproof ids are 1-32 of
	// [A-Za-z0-9_-]).
	IDPrefix string
	// Kubernetes is true for lock-server's key: lock-server runs on GKE
	// and reads it from the Kubernetes Secret LockServerSecret makes, not
	// from Secret Manager through Cloud Run.
	Kubernetes bool
}

// Keys are the lab's signing keys: lock-server's grant proofs
// (LOCK_PROOF_SIGNING_KEY, checked by both fence points with
// LOCK_PROOF_KEYS), rail-proxy's receipts (RAIL_RECEIPT_SIGNING_KEY,
// checked by payment-resource with RAIL_RECEIPT_KEYS) and payment-resource's
// payout terms (PAYMENT_TERMS_SIGNING_KEY, checked by rail-proxy with
// PAYMENT_TERMS_KEYS).
var Keys = []Key{
	{Secret: "lock-proof-signing-key", Var: "lock_proof_keys", IDPrefix: "lock", Kubernetes: true},
	{Secret: "rail-receipt-signing-key", Var: "rail_receipt_keys", IDPrefix: "rail"},
	{Secret: "payment-terms-signing-key", Var: "payment_terms_keys", IDPrefix: "pay"},
}

// SecretsTarget is the Terraform address of the module that creates the
// secrets: on a first deploy it is applied alone (with what it depends
// on, the budget first) so that the new keys' versions exist before any
// service that reads them is created.
const SecretsTarget = "module.secrets"

// ErrNoVersion: the secret does not exist, or has no version yet.
var ErrNoVersion = errors.New("labsetup: secret has no version")

// ErrKeys: the keys cannot be resolved: a stored secret half does not
// parse, or a public half set by hand (TF_VAR_<var>) does not match it.
var ErrKeys = errors.New("labsetup: signing keys")

// SecretVersions reads and adds versions of a project's secrets, by secret
// id. NewSecretManager returns the Secret Manager one.
type SecretVersions interface {
	// Latest returns the payload of the secret's latest version; an error
	// wrapping ErrNoVersion when the secret or its versions do not exist.
	Latest(ctx context.Context, secretID string) ([]byte, error)
	// Add adds payload as the secret's new latest version.
	Add(ctx context.Context, secretID string, payload []byte) error
}

// ResolvedKey is a Key with its secret half.
type ResolvedKey struct {
	Key
	// SecretID is the secret's id in the project.
	SecretID string
	// Signing is the secret half: read from Secret Manager, or made now.
	Signing fenceproof.SigningKey
	// New is true when Signing was made by this run: its secret has no
	// version yet, and AddNew must store it before any service starts.
	New bool
	// Public is the variable's value: TF_VAR_<Var> when set (it must list
	// Signing's public half), else Signing's public half alone.
	Public string
}

// ResolveKeys reads each key's secret half from sv (secret id
// namePrefix-Secret); a secret without a version gets a new Ed25519 key
// (from rnd, id from now), marked New. A TF_VAR_<Var> from getenv is kept
// as the public variable (to keep an old public key during a rotation) only
// if it lists the secret half's public key. Errors wrap ErrKeys, or are
// sv's.
func ResolveKeys(ctx context.Context, sv SecretVersions, namePrefix string, keys []Key, getenv func(string) string, rnd io.Reader, now time.Time) ([]ResolvedKey, error) {
	out := make([]ResolvedKey, 0, len(keys))
	for _, k := range keys {
		rk := ResolvedKey{Key: k, SecretID: namePrefix + "-" + k.Secret}
		payload, err := sv.Latest(ctx, rk.SecretID)
		switch {
		case errors.Is(err, ErrNoVersion):
			id := k.IDPrefix + "-" + now.UTC().Format("20060102-150405")
			if rk.Signing, err = fenceproof.GenerateSigningKey(id, rnd); err != nil {
				return nil, fmt.Errorf("%w: make %s: %v", ErrKeys, k.Secret, err)
			}
			rk.New = true
		case err != nil:
			return nil, fmt.Errorf("labsetup: read secret %s: %w", rk.SecretID, err)
		default:
			if rk.Signing, err = fenceproof.ParseSigningKey(strings.TrimSpace(string(payload))); err != nil {
				// The error may quote the payload: never print it.
				return nil, fmt.Errorf("%w: the latest version of secret %s is not a signing key (lockctl proof-key's format)", ErrKeys, rk.SecretID)
			}
		}
		pub := rk.Signing.VerifyKey().String()
		rk.Public = pub
		if set := strings.TrimSpace(getenv("TF_VAR_" + k.Var)); set != "" {
			if !slices.Contains(strings.Split(set, ","), pub) {
				if rk.New {
					return nil, fmt.Errorf("%w: TF_VAR_%s is set, but secret %s has no version yet: unset TF_VAR_%s so that labenv makes the pair", ErrKeys, k.Var, rk.SecretID, k.Var)
				}
				return nil, fmt.Errorf("%w: TF_VAR_%s does not list the public half of secret %s's latest version (%s): fence points would refuse every signature", ErrKeys, k.Var, rk.SecretID, pub)
			}
			rk.Public = set
		}
		out = append(out, rk)
	}
	return out, nil
}

// Vars returns the root-module variables of keys, by name.
func Vars(keys []ResolvedKey) map[string]string {
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k.Var] = k.Public
	}
	return m
}

// Placeholder is a well-formed public key (an id and 32 zero bytes) that
// stands for a key's public half where its value cannot matter: destroy
// evaluates the variables but creates nothing from them, and plan shows
// it where no key exists yet.
const Placeholder = "placeholder:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

// PlaceholderVars returns every key's variable set to Placeholder. Destroy
// uses them: it needs a valid value for each required variable and reads
// none of them, so it works whatever state Secret Manager is in.
func PlaceholderVars(keys []Key) map[string]string {
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k.Var] = Placeholder
	}
	return m
}

// PlanVars returns the keys' variables for a plan, reading only: each
// stored key's public half (or TF_VAR_<Var> when it lists it), else
// TF_VAR_<Var> when set, else Placeholder. It never makes or stores a key.
// A key it could not read (the secret missing, its latest version
// disabled or destroyed, Secret Manager off, sv nil) gets a note saying
// so; the notes are for the user, never an error.
func PlanVars(ctx context.Context, sv SecretVersions, namePrefix string, keys []Key, getenv func(string) string) (map[string]string, []string) {
	m := make(map[string]string, len(keys))
	var notes []string
	for _, k := range keys {
		id := namePrefix + "-" + k.Secret
		set := strings.TrimSpace(getenv("TF_VAR_" + k.Var))
		fallback := func(why string) {
			m[k.Var] = Placeholder
			if set != "" {
				m[k.Var] = set
			}
			notes = append(notes, fmt.Sprintf("%s: %s; this plan shows %s in its place (labenv deploy makes or reads the key)", k.Var, why, m[k.Var]))
		}
		if sv == nil {
			fallback("Secret Manager not reachable")
			continue
		}
		payload, err := sv.Latest(ctx, id)
		if err != nil {
			fallback(fmt.Sprintf("secret %s not read (%v)", id, err))
			continue
		}
		sk, err := fenceproof.ParseSigningKey(strings.TrimSpace(string(payload)))
		if err != nil {
			fallback(fmt.Sprintf("the latest version of secret %s is not a signing key", id))
			continue
		}
		pub := sk.VerifyKey().String()
		m[k.Var] = pub
		if set != "" && slices.Contains(strings.Split(set, ","), pub) {
			m[k.Var] = set
		}
	}
	return m, notes
}

// AnyNew reports whether a key was made by this run.
func AnyNew(keys []ResolvedKey) bool {
	return slices.ContainsFunc(keys, func(k ResolvedKey) bool { return k.New })
}

// AddNew stores the secret half of every new key as its secret's first
// version (the secrets must exist: apply SecretsTarget first), and marks
// them stored. It stops at the first failure.
func AddNew(ctx context.Context, sv SecretVersions, keys []ResolvedKey) error {
	for i := range keys {
		if !keys[i].New {
			continue
		}
		if err := sv.Add(ctx, keys[i].SecretID, []byte(keys[i].Signing.String())); err != nil {
			return fmt.Errorf("labsetup: add a version to secret %s: %w", keys[i].SecretID, err)
		}
		keys[i].New = false
	}
	return nil
}

// Find returns the resolved key of the given Secret name.
func Find(keys []ResolvedKey, secret string) (ResolvedKey, bool) {
	for _, k := range keys {
		if k.Secret == secret {
			return k, true
		}
	}
	return ResolvedKey{}, false
}

// secretManager is SecretVersions over the Secret Manager API.
type secretManager struct {
	c       *secretmanager.Client
	project string
}

// NewSecretManager returns SecretVersions of the project's Secret Manager
// (Application Default Credentials unless opts say otherwise) and its
// close function.
func NewSecretManager(ctx context.Context, project string, opts ...option.ClientOption) (SecretVersions, func() error, error) {
	c, err := secretmanager.NewClient(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("labsetup: Secret Manager client: %w", err)
	}
	return secretManager{c: c, project: project}, c.Close, nil
}

func (s secretManager) Latest(ctx context.Context, secretID string) ([]byte, error) {
	name := "projects/" + s.project + "/secrets/" + secretID + "/versions/latest"
	resp, err := s.c.AccessSecretVersion(ctx, &secretmanagerpb.AccessSecretVersionRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("%w: %s", ErrNoVersion, secretID)
	}
	if _, off := bootstrap.ServiceDisabled(err); off {
		return nil, fmt.Errorf("%w: secretmanager.googleapis.com: %w", bootstrap.ErrServiceDisabled, err)
	}
	if err != nil {
		return nil, err
	}
	return resp.GetPayload().GetData(), nil
}

func (s secretManager) Add(ctx context.Context, secretID string, payload []byte) error {
	_, err := s.c.AddSecretVersion(ctx, &secretmanagerpb.AddSecretVersionRequest{
		Parent:  "projects/" + s.project + "/secrets/" + secretID,
		Payload: &secretmanagerpb.SecretPayload{Data: payload},
	})
	return err
}
