package main

import (
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigDefaultsAndOverrides(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"LOCKDB_URL": "postgres://x/lockdb"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != "postgres" || c.Addr != "127.0.0.1:8080" || c.RequestTimeout != 5*time.Second || c.LockDBMaxConns != 16 || c.EtcdIdleLeases != 64 {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = loadConfig(env(map[string]string{
		"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": "http://a:2379, http://b:2379,", "PORT": "9000",
		"LOCK_REQUEST_TIMEOUT_MS": "750", "LOG_LEVEL": "debug", "ETCD_IDLE_LEASES": "0",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != "etcd" || len(c.EtcdEndpoints) != 2 || c.EtcdEndpoints[1] != "http://b:2379" || c.Addr != ":9000" || c.RequestTimeout != 750*time.Millisecond || c.EtcdIdleLeases != 0 || idleLeases(c.EtcdIdleLeases) != -1 {
		t.Fatalf("overrides: %+v", c)
	}
}

func TestConfigRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LOCK_STORE": "redis"}, "want postgres or etcd"},
		{map[string]string{"LOCK_STORE": "postgres"}, "LOCKDB_URL"},
		{map[string]string{"LOCK_STORE": "etcd"}, "ETCD_ENDPOINTS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_REQUEST_TIMEOUT_MS": "-5"}, "LOCK_REQUEST_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCKDB_MAX_CONNS": "many"}, "LOCKDB_MAX_CONNS"},
		{map[string]string{"LOCKDB_URL": "x", "LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_IDLE_LEASES": "-1"}, "ETCD_IDLE_LEASES"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_PREFIX": "/x"}, "ETCD_PREFIX"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_PREFIX": "x/"}, "ETCD_PREFIX"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_IDLE_LEASES": "lots"}, "ETCD_IDLE_LEASES"},
		{map[string]string{"LOCKDB_URL": "x", "LOG_LEVEL": "DEBUG+2"}, "LOG_LEVEL"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_REQUEST_TIMEOUT_MS": "9223372036854775807"}, "LOCK_REQUEST_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "abc"}, "PORT"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "70000"}, "PORT"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "080"}, "PORT"},
	} {
		_, err := loadConfig(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loadConfig(%v) = %v; want an error mentioning %q", tc.env, err, tc.want)
		}
	}
}
