// Package payoutevent is the message that drives the payout pipeline: the
// payout event payment-resource publishes to Pub/Sub when a payout is
// created, with the account id as ordering key, and the push envelope in
// which Pub/Sub delivers it to the executor.
//
// Delivery is at least once: the same event may reach several executors,
// at the same time or later. Every step the executor takes is therefore
// either idempotent or fenced; a redelivery is just another worker.
package payoutevent

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Event announces one payout to be executed. Amounts are in minor currency
// units (cents); Currency is an ISO 4217 code.
type Event struct {
	// PayoutID is the client-supplied payout id, 1..128 bytes.
	PayoutID string `json:"payoutId"`
	// AccountID is the debited account, 1..64 bytes; it names the lock
	// (payout:{account_id}) and is the Pub/Sub ordering key.
	AccountID string `json:"accountId"`
	// AmountMinor is the amount in minor currency units, positive.
	AmountMinor int64 `json:"amountMinor"`
	// Currency is an ISO 4217 code: three upper-case letters.
	Currency string `json:"currency"`
}

// Attribute names set on every published message.
const (
	// AttrPayoutID repeats the payout id, for filtering and logs.
	AttrPayoutID = "payoutId"
	// AttrAccountID repeats the account id.
	AttrAccountID = "accountId"
)

// Errors of Decode; test them with errors.Is.
var (
	// ErrMalformed: a push request or event payload cannot be decoded.
	ErrMalformed = errors.New("payoutevent: malformed message")
	// ErrMalformedPush wraps ErrMalformed when the request body itself is
	// not one well-formed push envelope (not JSON, a key given twice,
	// anything after the JSON value): Pub/Sub never sends such a body, so
	// its sender is a misbehaving HTTP client, not a poison message.
	ErrMalformedPush = fmt.Errorf("%w: not a Pub/Sub push body", ErrMalformed)
)

// Bounds of the payout vocabulary, the same in every part of the pipeline
// (payment-resource, rail-proxy, the executor and this event).
const (
	// MaxPayoutIDLen bounds a payout id, in bytes.
	MaxPayoutIDLen = 128
	// MaxAccountIDLen bounds an account id, in bytes, so that the lock key
	// "payout:{account_id}" stays a valid lock key.
	MaxAccountIDLen = 64
	// MaxAmountMinor bounds amounts and balances, in minor currency units
	// (10^15), far inside int64 so that sums cannot overflow.
	MaxAmountMinor int64 = 1_000_000_000_000_000
)

// ValidateID returns an error, naming the field what, unless v is 1..max
// bytes of ASCII letters and digits, with '.', '_', ':' and '-' allowed
// after the first byte: an id that fits in a lock key and never needs
// escaping in a URL path or a log line. Callers wrap it in their own
// sentinel error.
func ValidateID(what, v string, max int) error {
	if v == "" || len(v) > max {
		return fmt.Errorf("%s must be 1..%d bytes, got %d", what, max, len(v))
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			i > 0 && (c == '.' || c == '_' || c == ':' || c == '-') {
			continue
		}
		return fmt.Errorf("%s has byte %q at offset %d; allowed: letters, digits, and . _ : - after the first byte", what, v[i:i+1], i)
	}
	return nil
}

// Validate returns an error wrapping ErrMalformed unless the ids are
// well-formed (ValidateID), the amount is within 1..MaxAmountMinor and the
// currency is an ISO 4217 code.
func (e Event) Validate() error {
	if err := ValidateID("payoutId", e.PayoutID, MaxPayoutIDLen); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := ValidateID("accountId", e.AccountID, MaxAccountIDLen); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch {
	case e.AmountMinor <= 0 || e.AmountMinor > MaxAmountMinor:
		return fmt.Errorf("%w: amountMinor %d is outside 1..%d", ErrMalformed, e.AmountMinor, MaxAmountMinor)
	case !IsCurrency(e.Currency):
		return fmt.Errorf("%w: currency %q is not an ISO 4217 code", ErrMalformed, e.Currency)
	}
	return nil
}

// IsCurrency reports whether c has the shape of an ISO 4217 code: three
// upper-case ASCII letters.
func IsCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// LockKey returns the lock key the executor takes for this event:
// "payout:{account_id}", so payouts of one account are serialised.
func (e Event) LockKey() string { return "payout:" + e.AccountID }

// Push is the body of a Pub/Sub push request (the "wrapped" format).
// See https://cloud.google.com/pubsub/docs/push#receive_push.
type Push struct {
	// Message is the delivered message.
	Message PushMessage `json:"message"`
	// Subscription is the full name of the push subscription.
	Subscription string `json:"subscription"`
	// DeliveryAttempt is set when the subscription has a dead-letter policy;
	// the first delivery is 1.
	DeliveryAttempt *int `json:"deliveryAttempt,omitempty"`
}

// PushMessage is the message inside a Push.
type PushMessage struct {
	// Data is the base64 of the JSON Event.
	Data string `json:"data"`
	// Attributes repeat payoutId and accountId (AttrPayoutID, AttrAccountID).
	Attributes map[string]string `json:"attributes,omitempty"`
	// MessageID is Pub/Sub's id of the message; a redelivery keeps it.
	MessageID string `json:"messageId"`
	// PublishTime is when Pub/Sub stored the message (RFC 3339).
	PublishTime string `json:"publishTime,omitempty"`
	// OrderingKey is the account id: messages of one key are delivered in
	// publish order.
	OrderingKey string `json:"orderingKey,omitempty"`
}

// Decode returns the Event inside a push body, validated. Decoding is
// strict: the body and the event it carries must each be exactly one JSON
// value with no key given twice in any object (encoding/json alone would
// keep the last of two, and ignore anything after the event); the event's
// keys must be exactly its JSON names (encoding/json alone matches them
// case-insensitively) and nothing else. Errors wrap ErrMalformed: such a
// message will never decode, so the executor acknowledges it (logging it)
// rather than have it redelivered forever. A body that is not a well-formed
// push envelope wraps ErrMalformedPush as well.
func Decode(body []byte) (Push, Event, error) {
	var p Push
	if _, err := strictJSON(body); err != nil {
		return p, Event{}, fmt.Errorf("%w: %v", ErrMalformedPush, err)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return p, Event{}, fmt.Errorf("%w: %v", ErrMalformedPush, err)
	}
	raw, err := base64.StdEncoding.DecodeString(p.Message.Data)
	if err != nil {
		return p, Event{}, fmt.Errorf("%w: message data is not base64: %v", ErrMalformed, err)
	}
	keys, err := strictJSON(raw)
	if err != nil {
		return p, Event{}, fmt.Errorf("%w: payout event: %v", ErrMalformed, err)
	}
	for _, k := range keys {
		switch k {
		case "payoutId", "accountId", "amountMinor", "currency":
		default:
			return p, Event{}, fmt.Errorf("%w: payout event: unknown field %q", ErrMalformed, k)
		}
	}
	var e Event
	if err := json.Unmarshal(raw, &e); err != nil {
		return p, Event{}, fmt.Errorf("%w: payout event: %v", ErrMalformed, err)
	}
	if err := e.Validate(); err != nil {
		return p, Event{}, err
	}
	return p, e, nil
}

// strictJSON returns an error unless b is exactly one JSON value (white
// space around it aside) in which no object has a key twice; it returns
// the keys of b when b is an object.
func strictJSON(b []byte) ([]string, error) {
	if !json.Valid(b) { // also bounds the nesting depth walk recurses into
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		return nil, errors.New("not one JSON value")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var keys []string
	if err := walk(dec, &keys); err != nil {
		return nil, err
	}
	return keys, nil
}

// walk reads one JSON value from dec, refusing an object with a key given
// twice; when keys is not nil it receives the keys of that value if it is
// an object (nested objects are checked, not listed).
func walk(dec *json.Decoder, keys *[]string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := k.(string) // object keys are always strings
			if seen[key] {
				return fmt.Errorf("key %q is given twice", key)
			}
			seen[key] = true
			if keys != nil {
				*keys = append(*keys, key)
			}
			if err := walk(dec, nil); err != nil {
				return err
			}
		}
	case '[':
		for dec.More() {
			if err := walk(dec, nil); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// Encode returns the push body Pub/Sub would post for e, as tests need it.
func Encode(e Event, messageID, orderingKey string, deliveryAttempt int) ([]byte, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	attrs := map[string]string{AttrPayoutID: e.PayoutID, AttrAccountID: e.AccountID}
	return EncodeRaw(data, attrs, messageID, orderingKey, deliveryAttempt)
}

// EncodeRaw returns the push body Pub/Sub would post for a message with
// these data bytes and attributes, whatever they hold: the local push
// bridge forwards even a malformed message, so the executor decides.
// deliveryAttempt 0 leaves the field out, as Pub/Sub does without a
// dead-letter policy.
func EncodeRaw(data []byte, attrs map[string]string, messageID, orderingKey string, deliveryAttempt int) ([]byte, error) {
	p := Push{
		Message: PushMessage{
			Data:        base64.StdEncoding.EncodeToString(data),
			Attributes:  attrs,
			MessageID:   messageID,
			OrderingKey: orderingKey,
		},
		Subscription: "projects/local/subscriptions/payout-executor",
	}
	if deliveryAttempt > 0 {
		p.DeliveryAttempt = &deliveryAttempt
	}
	return json.Marshal(p)
}

// Attempt returns the delivery attempt of p as a string for logs ("" when
// Pub/Sub did not say).
func (p Push) Attempt() string {
	if p.DeliveryAttempt == nil {
		return ""
	}
	return strconv.Itoa(*p.DeliveryAttempt)
}
