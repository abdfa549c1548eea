package labsetup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/deploytest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/jackc/pgx/v5"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// seeded is a deterministic source of key and password bytes.
func seeded(seed uint64) io.Reader { return rand.NewChaCha8([32]byte{byte(seed)}) }

var now = time.Date(2026, 12, 1, 15, 4, 5, 0, time.UTC)

// fakeSecretManager is Secret Manager's gRPC surface as labsetup uses it:
// the secrets exist once created is true (as after terraform applies
// module.secrets); versions are kept per secret.
type fakeSecretManager struct {
	secretmanagerpb.UnimplementedSecretManagerServiceServer
	mu       sync.Mutex
	created  bool
	versions map[string][][]byte // by secret name
	adds     int
}

func (f *fakeSecretManager) AccessSecretVersion(_ context.Context, req *secretmanagerpb.AccessSecretVersionRequest) (*secretmanagerpb.AccessSecretVersionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	secret, ok := strings.CutSuffix(req.GetName(), "/versions/latest")
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "only latest is used")
	}
	v := f.versions[secret]
	if len(v) == 0 {
		return nil, status.Errorf(codes.NotFound, "Secret Version [%s] not found", req.GetName())
	}
	return &secretmanagerpb.AccessSecretVersionResponse{Name: req.GetName(), Payload: &secretmanagerpb.SecretPayload{Data: v[len(v)-1]}}, nil
}

func (f *fakeSecretManager) AddSecretVersion(_ context.Context, req *secretmanagerpb.AddSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.created {
		return nil, status.Errorf(codes.NotFound, "Secret [%s] not found", req.GetParent())
	}
	if f.versions == nil {
		f.versions = map[string][][]byte{}
	}
	f.versions[req.GetParent()] = append(f.versions[req.GetParent()], req.GetPayload().GetData())
	f.adds++
	return &secretmanagerpb.SecretVersion{Name: fmt.Sprintf("%s/versions/%d", req.GetParent(), len(f.versions[req.GetParent()]))}, nil
}

const project = "lab-project"

func startSecretManager(t *testing.T, f *fakeSecretManager) labsetup.SecretVersions {
	t.Helper()
	srv := pstest.NewServerWithCallback(0, func(s *grpc.Server) { secretmanagerpb.RegisterSecretManagerServiceServer(s, f) })
	t.Cleanup(func() { _ = srv.Close() })
	sv, closeSV, err := labsetup.NewSecretManager(context.Background(), project, option.WithEndpoint(srv.Addr),
		option.WithoutAuthentication(), option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeSV() })
	return sv
}

func noEnv(string) string { return "" }

// TestFirstDeployMakesTheKeysAndLaterDeploysReuseThem: on a fresh
// project every key is made (New), its public half is the variable, the
// versions are added once the secrets exist; the next deploy reads the
// same keys back and adds nothing.
func TestFirstDeployMakesTheKeysAndLaterDeploysReuseThem(t *testing.T) {
	ctx := context.Background()
	f := &fakeSecretManager{}
	sv := startSecretManager(t, f)

	first, err := labsetup.ResolveKeys(ctx, sv, "dlock", labsetup.Keys, noEnv, seeded(1), now)
	if err != nil {
		t.Fatal(err)
	}
	if !labsetup.AnyNew(first) || len(first) != len(labsetup.Keys) {
		t.Fatalf("fresh project: %d keys, AnyNew %v; want %d new", len(first), labsetup.AnyNew(first), len(labsetup.Keys))
	}
	vars := labsetup.Vars(first)
	for _, k := range first {
		if !k.New || k.SecretID != "dlock-"+k.Secret {
			t.Errorf("%s: New %v, SecretID %q", k.Secret, k.New, k.SecretID)
		}
		ring, err := fenceproof.ParseKeyring(vars[k.Var])
		if err != nil || ring.Len() != 1 {
			t.Errorf("variable %s = %q: %v", k.Var, vars[k.Var], err)
		}
		sig := k.Signing.Sign("test", "x")
		if _, err := ring.Verify(sig, "test", "x"); err != nil {
			t.Errorf("variable %s does not verify the secret half's signature: %v", k.Var, err)
		}
	}
	// Before the targeted apply the secrets do not exist: adding fails.
	if err := labsetup.AddNew(ctx, sv, first); err == nil {
		t.Fatal("AddNew before the secrets exist: nil error")
	}
	f.mu.Lock()
	f.created = true
	f.mu.Unlock()
	if err := labsetup.AddNew(ctx, sv, first); err != nil {
		t.Fatal(err)
	}
	if labsetup.AnyNew(first) || f.adds != len(labsetup.Keys) {
		t.Fatalf("after AddNew: AnyNew %v, %d versions added; want false, %d", labsetup.AnyNew(first), f.adds, len(labsetup.Keys))
	}

	again, err := labsetup.ResolveKeys(ctx, sv, "dlock", labsetup.Keys, noEnv, seeded(2), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if labsetup.AnyNew(again) {
		t.Error("second deploy made a new key although every secret has a version")
	}
	if got := labsetup.Vars(again); fmt.Sprint(got) != fmt.Sprint(vars) {
		t.Errorf("second deploy's variables %v, want the first's %v", got, vars)
	}
	if err := labsetup.AddNew(ctx, sv, again); err != nil || f.adds != len(labsetup.Keys) {
		t.Errorf("second deploy added versions: %v, %d in all", err, f.adds)
	}
}

// TestAPublicHalfSetByHandMustListTheSecretOne: TF_VAR_<var> may carry an
// extra key (a rotation) but must list the secret half's public key.
func TestAPublicHalfSetByHandMustListTheSecretOne(t *testing.T) {
	ctx := context.Background()
	f := &fakeSecretManager{created: true}
	sv := startSecretManager(t, f)
	keys, err := labsetup.ResolveKeys(ctx, sv, "dlock", labsetup.Keys, noEnv, seeded(3), now)
	if err != nil {
		t.Fatal(err)
	}
	if err := labsetup.AddNew(ctx, sv, keys); err != nil {
		t.Fatal(err)
	}
	other, _ := fenceproof.GenerateSigningKey("other", seeded(4))
	lock, _ := labsetup.Find(keys, "lock-proof-signing-key")
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "TF_VAR_"+lock.Var {
				return v
			}
			return ""
		}
	}
	rotation := other.VerifyKey().String() + "," + lock.Public
	got, err := labsetup.ResolveKeys(ctx, sv, "dlock", labsetup.Keys, env(rotation), seeded(5), now)
	if err != nil {
		t.Fatalf("a rotation listing the stored key: %v", err)
	}
	if v := labsetup.Vars(got)[lock.Var]; v != rotation {
		t.Errorf("variable %s = %q, want the hand-set %q", lock.Var, v, rotation)
	}
	_, err = labsetup.ResolveKeys(ctx, sv, "dlock", labsetup.Keys, env(other.VerifyKey().String()), seeded(5), now)
	if !errors.Is(err, labsetup.ErrKeys) || !strings.Contains(err.Error(), "TF_VAR_"+lock.Var) {
		t.Errorf("a hand-set key not listing the stored one: %v, want ErrKeys naming TF_VAR_%s", err, lock.Var)
	}
	// A fresh project with the variable set: refused, nothing made.
	_, err = labsetup.ResolveKeys(ctx, startSecretManager(t, &fakeSecretManager{}), "dlock", labsetup.Keys, env(rotation), seeded(6), now)
	if !errors.Is(err, labsetup.ErrKeys) {
		t.Errorf("hand-set variable on a fresh project: %v, want ErrKeys", err)
	}
}

// TestAStoredVersionThatIsNotAKeyIsRefusedWithoutPrintingIt.
func TestAStoredVersionThatIsNotAKeyIsRefusedWithoutPrintingIt(t *testing.T) {
	const secretish = "hunter2-not-a-key"
	f := &fakeSecretManager{created: true, versions: map[string][][]byte{
		"projects/" + project + "/secrets/dlock-lock-proof-signing-key": {[]byte(secretish)},
	}}
	_, err := labsetup.ResolveKeys(context.Background(), startSecretManager(t, f), "dlock", labsetup.Keys, noEnv, seeded(7), now)
	if !errors.Is(err, labsetup.ErrKeys) || strings.Contains(err.Error(), secretish) {
		t.Errorf("err = %v; want ErrKeys without the payload", err)
	}
}

// TestKeysMatchTheSecretsModule: every secret the root module gives to
// module "secrets" (its readers) is one labsetup makes, and the reverse;
// each key not delivered through Kubernetes is read by a Cloud Run
// service (module.secrets.ids[...]). A new secret without a key here
// would start its service without a version.
func TestKeysMatchTheSecretsModule(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "main.tf"))
	if err != nil {
		t.Fatal(err)
	}
	file, diags := hclsyntax.ParseConfig(src, "main.tf", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	var readers []string
	for _, b := range file.Body.(*hclsyntax.Body).Blocks {
		if b.Type != "module" || len(b.Labels) != 1 || "module."+b.Labels[0] != labsetup.SecretsTarget {
			continue
		}
		obj, ok := b.Body.Attributes["readers"].Expr.(*hclsyntax.ObjectConsExpr)
		if !ok {
			t.Fatalf("%s: readers is not an object", labsetup.SecretsTarget)
		}
		for _, item := range obj.Items {
			readers = append(readers, hcl.ExprAsKeyword(item.KeyExpr))
		}
	}
	var names []string
	for _, k := range labsetup.Keys {
		names = append(names, k.Secret)
		if !k.Kubernetes && !bytes.Contains(src, []byte(`module.secrets.ids["`+k.Secret+`"]`)) {
			t.Errorf("no service reads secret %s (module.secrets.ids[%q])", k.Secret, k.Secret)
		}
	}
	slices.Sort(readers)
	slices.Sort(names)
	if !slices.Equal(readers, names) {
		t.Errorf("module secrets' readers %v, labsetup.Keys %v: they must name the same secrets", readers, names)
	}
	vars, err := os.ReadFile(filepath.Join("..", "variables.tf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range labsetup.Keys {
		if !bytes.Contains(vars, []byte(`variable "`+k.Var+`"`)) {
			t.Errorf("variables.tf has no variable %q", k.Var)
		}
	}
}

// TestLockServerSecretIsWhatTheDeploymentReads decodes the Secret
// strictly and checks its namespace, name and key against the
// Deployment's secretKeyRef for LOCK_PROOF_SIGNING_KEY.
func TestLockServerSecretIsWhatTheDeploymentReads(t *testing.T) {
	k, err := fenceproof.GenerateSigningKey("lock-1", seeded(8))
	if err != nil {
		t.Fatal(err)
	}
	b, err := labsetup.LockServerSecret(k)
	if err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatal(err)
	}
	if s.Kind != "Secret" || s.APIVersion != "v1" {
		t.Errorf("kind %q apiVersion %q", s.Kind, s.APIVersion)
	}
	if got, err := fenceproof.ParseSigningKey(s.StringData[labsetup.KubeSecretKey]); err != nil || got.String() != k.String() {
		t.Errorf("the Secret's %q does not hold the key: %v", labsetup.KubeSecretKey, err)
	}
	m, err := deploytest.DecodeFiles(filepath.Join("..", "..", "lockserver", "deploy", "lock-server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range m.Deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.Name != "LOCK_PROOF_SIGNING_KEY" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				found = true
				ref := e.ValueFrom.SecretKeyRef
				if d.Namespace != s.Namespace || ref.Name != s.Name || ref.Key != labsetup.KubeSecretKey {
					t.Errorf("the Deployment reads %s/%s key %q; labsetup writes %s/%s key %q",
						d.Namespace, ref.Name, ref.Key, s.Namespace, s.Name, labsetup.KubeSecretKey)
				}
			}
		}
	}
	if !found {
		t.Fatal("lock-server.yaml reads LOCK_PROOF_SIGNING_KEY from no Secret")
	}
}

// fakePasswords records every password set, and can fail the reset.
type fakePasswords struct {
	mu        sync.Mutex
	set       []string // "instance user password"
	failReset bool
}

func (f *fakePasswords) SetPassword(_ context.Context, instance, user, password string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.set {
		if strings.HasPrefix(s, instance+" ") {
			n++
		}
	}
	f.set = append(f.set, instance+" "+user+" "+password)
	if f.failReset && n%2 == 1 {
		return errors.New("backend error")
	}
	return nil
}

// TestGrantsGiveEachServiceCreateOnItsSchema runs the three grants on
// three local databases standing in for paydb, raildb and lockdb, with
// roles named as Cloud SQL names IAM users; each role can then create in
// public, the postgres password was set once per instance and then reset
// to another value.
func TestGrantsGiveEachServiceCreateOnItsSchema(t *testing.T) {
	ctx := context.Background()
	prefix := fmt.Sprintf("lab%d", time.Now().UnixNano()%1e9) // roles are cluster-wide
	emails := map[string]string{}
	dsn := map[string]string{}
	for _, g := range labsetup.SchemaGrants {
		emails[g.Service] = prefix + "-" + g.Service + "@" + project + ".iam.gserviceaccount.com"
		t.Run(g.Database, func(t *testing.T) { dsn[g.Database] = pgtest.NewDatabase(t) })
	}
	admin, err := pgx.Connect(ctx, dsn["paydb"])
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, e := range emails {
		u := pgx.Identifier{labsetup.IAMUser(e)}.Sanitize()
		if _, err := admin.Exec(ctx, "CREATE ROLE "+u+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP OWNED BY "+u+"; DROP ROLE "+u) })
	}
	// PostgreSQL 15 does not give CREATE on public to other roles; the
	// test databases belong to the superuser, as Cloud SQL's do not, so
	// take the right away explicitly to stand where a fresh Cloud SQL
	// database stands.
	for _, d := range dsn {
		c, err := pgx.Connect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
		c.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	canCreate := func(database, service string) bool {
		c, err := pgx.Connect(ctx, dsn[database])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var ok bool
		if err := c.QueryRow(ctx, "SELECT has_schema_privilege($1, 'public', 'CREATE')", labsetup.IAMUser(emails[service])).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, g := range labsetup.SchemaGrants {
		if canCreate(g.Database, g.Service) {
			t.Fatalf("%s can create in %s before the grant: the test stands nowhere", g.Service, g.Database)
		}
	}
	outputs := map[string]json.RawMessage{}
	put := func(k string, v any) { outputs[k], _ = json.Marshal(v) }
	put("service_accounts", emails)
	put("pay_instance", project+":europe-west1:dlock-pay")
	put("lock_instance", project+":europe-west1:dlock-lock")
	pw := &fakePasswords{}
	var connected []string
	connect := func(ctx context.Context, instance, database, user, password string) (*pgx.Conn, error) {
		pw.mu.Lock()
		last := pw.set[len(pw.set)-1]
		pw.mu.Unlock()
		if want := instance[strings.LastIndex(instance, ":")+1:] + " " + user + " " + password; last != want || user != "postgres" {
			return nil, fmt.Errorf("connected to %s as %s with a password that is not the one just set", instance, user)
		}
		connected = append(connected, instance+"/"+database)
		return pgx.Connect(ctx, dsn[database])
	}
	var logs bytes.Buffer
	if err := labsetup.GrantSchemas(ctx, pw, connect, outputs, labsetup.SchemaGrants, seeded(9), slog.New(slog.NewJSONHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	for _, g := range labsetup.SchemaGrants {
		if !canCreate(g.Database, g.Service) {
			t.Errorf("%s cannot create in %s after the grants", g.Service, g.Database)
		}
	}
	want := []string{project + ":europe-west1:dlock-pay/paydb", project + ":europe-west1:dlock-pay/raildb", project + ":europe-west1:dlock-lock/lockdb"}
	if !slices.Equal(connected, want) {
		t.Errorf("connections %v, want %v", connected, want)
	}
	if len(pw.set) != 4 {
		t.Fatalf("passwords set %d times, want 4 (set and reset per instance): %v", len(pw.set), pw.set)
	}
	for i := 0; i < 4; i += 2 {
		if pw.set[i] == pw.set[i+1] || strings.Fields(pw.set[i])[0] != strings.Fields(pw.set[i+1])[0] {
			t.Errorf("instance %d: set %q then %q: want the same instance, a different password", i/2, pw.set[i], pw.set[i+1])
		}
	}
	for _, p := range pw.set {
		if strings.Contains(logs.String(), strings.Fields(p)[2]) {
			t.Error("a password reached the log")
		}
	}
	// Idempotent: a second run changes nothing and fails nothing.
	if err := labsetup.GrantSchemas(ctx, &fakePasswords{}, func(ctx context.Context, _, database, _, _ string) (*pgx.Conn, error) {
		return pgx.Connect(ctx, dsn[database])
	}, outputs, labsetup.SchemaGrants, seeded(10), slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("second run: %v", err)
	}
}

// TestAFailedGrantStillResetsThePassword: a grant that fails (here the
// role does not exist) is reported, and the password is reset anyway; a
// failed reset is reported with what to do.
func TestAFailedGrantStillResetsThePassword(t *testing.T) {
	ctx := context.Background()
	d := pgtest.NewDatabase(t)
	outputs := map[string]json.RawMessage{}
	outputs["service_accounts"], _ = json.Marshal(map[string]string{"lock-server": "no-such-role@p.iam.gserviceaccount.com"})
	outputs["lock_instance"], _ = json.Marshal("p:r:dlock-lock")
	grants := []labsetup.SchemaGrant{{Instance: "lock_instance", Database: "lockdb", Service: "lock-server"}}
	connect := func(ctx context.Context, _, _, _, _ string) (*pgx.Conn, error) { return pgx.Connect(ctx, d) }
	pw := &fakePasswords{}
	err := labsetup.GrantSchemas(ctx, pw, connect, outputs, grants, seeded(11), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "dlock-lock/lockdb") {
		t.Errorf("err = %v, want the failed grant named", err)
	}
	if len(pw.set) != 2 {
		t.Errorf("passwords set %d times, want 2 (the reset runs after a failed grant)", len(pw.set))
	}
	pw = &fakePasswords{failReset: true}
	outputs["service_accounts"], _ = json.Marshal(map[string]string{"lock-server": "postgres@p.iam.gserviceaccount.com"})
	err = labsetup.GrantSchemas(ctx, pw, connect, outputs, grants, seeded(12), slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "set-password") {
		t.Errorf("failed reset: err = %v, want it reported with the command to run", err)
	}
	// Missing outputs are refused before any password changes.
	pw = &fakePasswords{}
	delete(outputs, "lock_instance")
	if err := labsetup.GrantSchemas(ctx, pw, connect, outputs, grants, seeded(13), slog.New(slog.DiscardHandler)); !errors.Is(err, labsetup.ErrOutputs) || len(pw.set) != 0 {
		t.Errorf("missing output: err %v, %d passwords set; want ErrOutputs and none", err, len(pw.set))
	}
}
