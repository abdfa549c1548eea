package store

import (
	"fmt"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// ValidateAcquire checks the arguments of LockStore.Acquire against the
// bounds of package api and returns an error wrapping ErrInvalidArgument.
// Stores call it first so that a direct caller and an HTTP client are held
// to the same rules.
func ValidateAcquire(key, owner string, ttl time.Duration) error {
	if err := api.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err := api.ValidateOwner(owner); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if ttl%time.Millisecond != 0 {
		return fmt.Errorf("%w: ttl %v is not a whole number of milliseconds", ErrInvalidArgument, ttl)
	}
	if err := api.ValidateTTLMs(ttl.Milliseconds()); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// ValidateLease checks the (key, owner, token) triple of Renew and Release
// and returns an error wrapping ErrInvalidArgument.
func ValidateLease(key, owner string, token int64) error {
	if err := api.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err := api.ValidateOwner(owner); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err := api.ValidateToken(token); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// ValidateKey checks a key for Revoke and Inspect and returns an error
// wrapping ErrInvalidArgument.
func ValidateKey(key string) error {
	if err := api.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// ValidateRevokeToken checks the optional token of Revoke (0 or positive).
func ValidateRevokeToken(token int64) error {
	if token < 0 {
		return fmt.Errorf("%w: token is %d; use 0 to revoke whatever lease is live", ErrInvalidArgument, token)
	}
	return nil
}
