package deploytest_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"sigs.k8s.io/yaml"
)

// configKeys are the keys of etcd's configuration file, which are its flag
// names: the json tags of embed.Config plus the URL lists the file parser
// reads itself (embed's configJSON).
func configKeys() map[string]bool {
	keys := map[string]bool{
		"listen-peer-urls": true, "listen-client-urls": true, "listen-client-http-urls": true,
		"initial-advertise-peer-urls": true, "advertise-client-urls": true,
	}
	t := reflect.TypeFor[embed.Config]()
	for i := range t.NumField() {
		if tag := strings.Split(t.Field(i).Tag.Get("json"), ",")[0]; tag != "" && tag != "-" {
			keys[tag] = true
		}
	}
	return keys
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestEtcdManifestFlagsFormAThreeMemberCluster takes the flags of the
// StatefulSet's container as they are, expands $(POD_NAME) and
// $(POD_NAMESPACE) as the kubelet would for etcd-0..2, rewrites the
// members' DNS names and wildcard listen addresses to loopback ports,
// turns them into etcd's configuration file (whose keys are the flag
// names; an unknown flag fails the test), loads it with
// embed.ConfigFromFile, starts the three members at once (Parallel) and
// expects one leader that all three agree on, and /livez and /readyz
// answered 200 on the metrics address the probes use.
func TestEtcdManifestFlagsFormAThreeMemberCluster(t *testing.T) {
	m := decode(t, etcdManifest)
	c := m.StatefulSets[0].Spec.Template.Spec.Containers[0]
	ns := m.StatefulSets[0].Namespace
	const members = 3
	known := configKeys()

	type ports struct{ peer, client, metrics int }
	p := make([]ports, members)
	for i := range p {
		p[i] = ports{freePort(t), freePort(t), freePort(t)}
	}
	var replace []string
	for j := range members {
		host := fmt.Sprintf("etcd-%d.%s.%s.svc.cluster.local", j, m.StatefulSets[0].Spec.ServiceName, ns)
		replace = append(replace,
			host+":2380", fmt.Sprintf("127.0.0.1:%d", p[j].peer),
			host+":2379", fmt.Sprintf("127.0.0.1:%d", p[j].client))
	}

	dir := t.TempDir()
	servers := make([]*embed.Etcd, members)
	for i := range members {
		// First what the kubelet expands, then the addresses.
		expand := strings.NewReplacer("$(POD_NAME)", fmt.Sprintf("etcd-%d", i), "$(POD_NAMESPACE)", ns)
		own := append([]string{
			"0.0.0.0:2380", fmt.Sprintf("127.0.0.1:%d", p[i].peer),
			"0.0.0.0:2379", fmt.Sprintf("127.0.0.1:%d", p[i].client),
			"0.0.0.0:2381", fmt.Sprintf("127.0.0.1:%d", p[i].metrics),
		}, replace...)
		r := strings.NewReplacer(own...)
		file := map[string]any{}
		for _, a := range c.Args {
			k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !ok || !strings.HasPrefix(a, "--") {
				t.Fatalf("flag %q is not --name=value", a)
			}
			if !known[k] {
				t.Fatalf("flag --%s is not one of etcd's configuration keys", k)
			}
			v = r.Replace(expand.Replace(v))
			if strings.Contains(v, "$(") || strings.Contains(v, "svc.cluster.local") || strings.Contains(v, "0.0.0.0") {
				t.Fatalf("flag --%s still names a cluster address after rewriting: %s", k, v)
			}
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				file[k] = n
			} else {
				file[k] = v
			}
		}
		file["data-dir"] = filepath.Join(dir, fmt.Sprintf("etcd-%d", i))
		file["log-level"] = "error"
		b, err := yaml.Marshal(file)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("etcd-%d.yaml", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := embed.ConfigFromFile(path)
		if err != nil {
			t.Fatalf("etcd-%d: ConfigFromFile: %v\n%s", i, err, b)
		}
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			t.Fatalf("etcd-%d: start: %v\n%s", i, err, b)
		}
		servers[i] = e
		t.Cleanup(e.Close)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, e := range servers {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			t.Fatalf("etcd-%d: %v", i, err)
		case <-ctx.Done():
			t.Fatalf("etcd-%d not ready within 30 s: the flags do not form a cluster", i)
		}
	}
	leader := servers[0].Server.Leader()
	if leader == 0 {
		t.Fatal("no leader after all members are ready")
	}
	for i, e := range servers {
		if got := e.Server.Leader(); got != leader {
			t.Errorf("etcd-%d sees leader %x, etcd-0 sees %x", i, got, leader)
		}
		if n := len(e.Server.Cluster().Members()); n != members {
			t.Errorf("etcd-%d sees %d members, want %d", i, n, members)
		}
		for _, path := range []string{"/livez", "/readyz"} {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p[i].metrics, path))
			if err != nil {
				t.Errorf("etcd-%d %s: %v", i, path, err)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("etcd-%d %s = %d, want 200", i, path, resp.StatusCode)
			}
		}
	}
}
