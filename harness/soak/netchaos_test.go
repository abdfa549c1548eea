package soak_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/soak"
)

func TestParseFaults(t *testing.T) {
	got, err := soak.ParseFaults(" kill,net,kill ")
	if err != nil || !slices.Equal(got, []string{soak.FaultsKill, soak.FaultsNet}) {
		t.Fatalf("ParseFaults(kill,net,kill) = %v, %v; want [kill net]", got, err)
	}
	if _, err := soak.ParseFaults("kill,flood"); !errors.Is(err, soak.ErrInvalidConfig) {
		t.Fatalf("ParseFaults(kill,flood) = %v; want ErrInvalidConfig", err)
	}
	cfg := soak.DefaultConfig()
	cfg.Faults, cfg.NetHold = []string{soak.FaultsNet}, 0
	if err := cfg.Validate(); !errors.Is(err, soak.ErrInvalidConfig) {
		t.Fatalf("Validate with network faults and no NetHold = %v; want ErrInvalidConfig", err)
	}
}
