// Package jsonhandler holds the JSON-over-HTTP plumbing every service of the
// project shares: strict request decoding and the uniform error envelope
// {"error":{"code","message","retryable"}}. Each service keeps its own list
// of codes; this package only knows the three that decoding itself produces.
package jsonhandler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Codes produced by Decode.
const (
	// CodeInvalidRequest (400): the body is not one JSON object of the
	// expected shape.
	CodeInvalidRequest = "INVALID_REQUEST"
	// CodeBodyTooLarge (413): the body exceeds the limit given to Decode.
	CodeBodyTooLarge = "BODY_TOO_LARGE"
	// CodeUnsupportedMediaType (415): a Content-Type other than application/json.
	CodeUnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE"
)

// Envelope is the body of every error answer.
type Envelope struct {
	// Error is the refusal.
	Error Body `json:"error"`
}

// Body is the content of an Envelope: a stable code, a message for people,
// and whether the same request may succeed later.
type Body struct {
	// Code is stable and machine-readable.
	Code string `json:"code"`
	// Message is for people; it may change.
	Message string `json:"message"`
	// Retryable says whether the same request may succeed later.
	Retryable bool `json:"retryable"`
}

// Error is a refused request body: the status and code to answer with.
type Error struct {
	// Status is the HTTP status to answer with (400, 413 or 415).
	Status int
	// Code is one of CodeInvalidRequest, CodeBodyTooLarge,
	// CodeUnsupportedMediaType.
	Code string
	// Message says what was wrong with the body.
	Message string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// ContentType applies the project's one Content-Type rule to a request
// that carries a JSON body: the header is sent exactly once (two or more
// are refused 400 CodeInvalidRequest: which one the sender meant is
// unknown, and net/http's Header.Get would read only the first), and it
// is application/json (or one of the media types in also) with no
// charset or charset=utf-8 (anything else, or no header at all, is
// refused 415 CodeUnsupportedMediaType). It returns nil or the *Error to
// answer with.
func ContentType(r *http.Request, also ...string) *Error {
	vs := r.Header.Values("Content-Type")
	switch {
	case len(vs) > 1:
		return &Error{http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("Content-Type is sent %d times; send it once, as application/json", len(vs))}
	case len(vs) == 0:
		return &Error{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "no Content-Type; a request with a body must send Content-Type: application/json"}
	}
	ct := vs[0]
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !slices.Contains(also, mt)) {
		return &Error{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, fmt.Sprintf("content type %q; send application/json", ct)}
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return &Error{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
			fmt.Sprintf("charset %q; JSON is UTF-8: send application/json without a charset, or with charset=utf-8", cs)}
	}
	return nil
}

// Decode reads exactly one JSON object of at most limit bytes into dst (a
// pointer to a struct), refusing a request whose Content-Type breaks the
// rule of ContentType (missing while there is a body, sent twice, not
// application/json, a charset other than UTF-8), an empty body (400),
// anything but an object (null included),
// field names that do not match a json tag of dst exactly (encoding/json
// alone would match them case-insensitively), a field given twice,
// anything after the object, and a string (key or value) that is not
// UTF-8 text (checkStrings). It returns nil or an *Error to answer with
// (see Write).
func Decode(w http.ResponseWriter, r *http.Request, dst any, limit int64) error {
	return decode(w, r, dst, limit, false)
}

// DecodeRefusingNull is Decode that also refuses a field whose value is
// JSON null (400 CodeInvalidRequest). encoding/json leaves a field sent
// as null at its zero value, so that "waitMs": null would read as 0 (no
// wait) and a revoke's "token": null as 0 (revoke whatever lease is
// live): for an API whose optional fields mean something when left out,
// null is a third value with no meaning, and is refused rather than
// guessed. lock-server's requests are decoded with it.
func DecodeRefusingNull(w http.ResponseWriter, r *http.Request, dst any, limit int64) error {
	return decode(w, r, dst, limit, true)
}

func decode(w http.ResponseWriter, r *http.Request, dst any, limit int64, refuseNull bool) error {
	// A Content-Type that is sent is checked before the body is read; a
	// missing one only once the body is known to be there (a POST with
	// no body at all is refused below as an empty body, 400).
	noType := len(r.Header.Values("Content-Type")) == 0
	if e := ContentType(r); e != nil && !noType {
		return e
	}
	// MaxBytesReader marks the connection to be closed after an oversized
	// body only when it is handed net/http's own writer, so unwrap any
	// middleware's (the Unwrap convention of http.ResponseController).
	body, err := io.ReadAll(http.MaxBytesReader(unwrap(w), r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return &Error{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("body larger than %d bytes", limit)}
	}
	if err != nil {
		// The cause (a read timeout, a reset) names the connection's
		// addresses: never in an answer.
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "the body could not be read: it came too slowly or the connection broke"}
	}
	if noType && len(bytes.TrimSpace(body)) > 0 {
		return ContentType(r)
	}
	if e := decodeBody(body, dst, refuseNull); e != nil {
		return e
	}
	return nil
}

// decodeBody is the part of decode that judges the body's bytes and fills
// dst: nil, or the *Error to answer with. Its checks run in a fixed order,
// and the first that fails names the problem.
func decodeBody(body []byte, dst any, refuseNull bool) *Error {
	// Bytes that are not UTF-8 first, before a key is read: encoding/json
	// turns them into U+FFFD, so an unknown key "\xff" would be named
	// "\ufffd" (a newcomer probe found it) instead of being refused as not UTF-8.
	if !utf8.Valid(body) {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + errNotUTF8.Error()}
	}
	if fields := fieldNames(dst); !plainObject(body, fields, refuseNull) {
		if err := checkObject(body, fields, refuseNull); err != nil {
			return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + jsonProblem(err)}
		}
	}
	if mayHoldRuneError(body) {
		if err := checkStrings(body); err != nil {
			return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + err.Error()}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + jsonProblem(err)}
	}
	return nil
}

// mayHoldRuneError reports whether a string of body (valid UTF-8, and one
// JSON object) can decode to a string holding U+FFFD, the only thing
// checkStrings refuses in such a body. encoding/json writes U+FFFD for
// U+FFFD itself, for bytes that are not UTF-8 (there are none), and for a
// \u escape (\ufffd, or a surrogate escape that is not half of a
// pair); a JSON object holds U+FFFD's bytes only inside a string. So a
// body with neither U+FFFD nor a backslash followed by "u" decodes to no
// U+FFFD, and checkStrings, a second tokenization of the whole body,
// would accept it. A "\\u" (an escaped backslash, then u) is counted
// too: that only costs the full check.
func mayHoldRuneError(body []byte) bool {
	return bytes.Contains(body, []byte(`\u`)) || bytes.Contains(body, []byte(string(utf8.RuneError)))
}

// DecodeEmpty is Decode for a POST that takes no parameters: it accepts
// an empty body (or only white space) without a Content-Type, and
// otherwise exactly what Decode accepts for an empty object, "{}". A
// Content-Type that is sent is held to ContentType's rule even with an
// empty body.
func DecodeEmpty(w http.ResponseWriter, r *http.Request, limit int64) error {
	return DecodeOptional(w, r, &struct{}{}, limit)
}

// DecodeOptional is Decode for a POST whose body may be left out: an
// empty body (or only white space) is accepted as DecodeEmpty accepts it
// and leaves dst as it is; any other body is decoded into dst as Decode
// does.
func DecodeOptional(w http.ResponseWriter, r *http.Request, dst any, limit int64) error {
	body, err := io.ReadAll(http.MaxBytesReader(unwrap(w), r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return &Error{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("body larger than %d bytes", limit)}
	case err != nil:
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "the body could not be read: it came too slowly or the connection broke"}
	case len(bytes.TrimSpace(body)) == 0:
		if len(r.Header.Values("Content-Type")) == 0 {
			return nil
		}
		if e := ContentType(r); e != nil {
			return e
		}
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return Decode(w, r, dst, limit)
}

// goPrefixes are the Go package and function names that start the parts
// of a wrapped error's text ("lockserver: invalid argument: ..."): the
// code's layout, not something a client should read or match on.
var goPrefixes = map[string]bool{
	"lockserver": true, "api": true, "paymentresource": true, "railproxy": true, "railstub": true,
	"fencing": true, "fenceproof": true, "payoutevent": true, "iso4217": true, "jsonhandler": true,
	"jsonclient": true, "pgstore": true, "etcdstore": true, "memstore": true, "overload": true,
	"decode": true, "json": true, "strconv": true, "strconv.ParseInt": true, "strconv.Atoi": true,
}

// ClientMessage returns the message of a 4xx answer for err: a refused
// body's own message (Decode's *Error), or err's text without the Go
// package names that prefix its wrapped parts ("lockserver: invalid
// argument: ttlMs is 1; ..." becomes "invalid argument: ttlMs is 1; ...").
// What a client reads then stays the same when the code is reorganised;
// the full text belongs in the service's log line. Never use it for a 5xx,
// whose cause must not reach the client at all.
func ClientMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	parts := strings.Split(err.Error(), ": ")
	kept := parts[:0]
	for _, p := range parts {
		if !goPrefixes[p] {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ": ")
}

// jsonProblem says what is wrong with a body in the client's terms: the
// JSON field and the kind of value it wants, where the syntax breaks, or
// that the body ends early; never a Go type.
func jsonProblem(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return fmt.Sprintf("field %q wants %s, got a JSON %s", typeErr.Field, kindOf(typeErr.Type), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("invalid JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the body ends before the JSON object does"
	}
	return err.Error()
}

// kindOf names the JSON value a Go type decodes from.
func kindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// checkObject verifies that body is one JSON object whose keys are all in
// fields (when fields is not nil), none repeated, with nothing after it,
// and (refuseNull) no value null.
func checkObject(body []byte, fields map[string]bool, refuseNull bool) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if errors.Is(err, io.EOF) {
		return errors.New("empty body; send a JSON object")
	}
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("the body is %v, not a JSON object", describe(tok))
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string) // object keys are always strings
		if seen[key] {
			return fmt.Errorf("field %q is given twice", key)
		}
		seen[key] = true
		if fields != nil && !fields[key] {
			return fmt.Errorf("unknown field %q", key)
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
		if refuseNull && string(bytes.TrimSpace(skip)) == "null" {
			return fmt.Errorf("field %q is null; leave a field out to mean its default, or send a value", key)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// maxPlainKeys bounds the keys plainObject compares pairwise for
// repeats; a body with more goes to checkObject.
const maxPlainKeys = 16

// plainObject reports whether checkObject(body, fields, refuseNull) is
// certainly nil, for a body already known to be valid UTF-8, without
// checkObject's cost (a json.Decoder reading a token or a value at a
// time, with allocations for each). It answers true only for the common
// case: valid JSON (json.Valid, the scanner encoding/json itself uses,
// with the same nesting limit) that is one object, whose top-level keys
// have no escape (so that their bytes are their text), are at most
// maxPlainKeys, none repeated, all in fields (unless fields is nil), and,
// with refuseNull, no top-level value null. Any other body, accepted or
// not, gets false, and checkObject itself then judges it and words the
// refusal. FuzzDecodeBodyMatchesThreePasses holds the two together.
func plainObject(body []byte, fields map[string]bool, refuseNull bool) bool {
	if !json.Valid(body) {
		return false
	}
	// From here on body is one valid JSON value with white space around.
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return false
	}
	var keys [maxPlainKeys][]byte
	n := 0
	for i = skipSpace(body, i+1); body[i] != '}'; i = skipSpace(body, i) {
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
		// body[i] is the opening quote of a key.
		end := bytes.IndexByte(body[i+1:], '"') + i + 1
		key := body[i+1 : end]
		if bytes.IndexByte(key, '\\') >= 0 || n == maxPlainKeys || (fields != nil && !fields[string(key)]) {
			return false
		}
		for _, k := range keys[:n] {
			if bytes.Equal(k, key) {
				return false
			}
		}
		keys[n] = key
		n++
		i = skipSpace(body, end+1) + 1 // past the colon
		i = skipSpace(body, i)
		if refuseNull && body[i] == 'n' { // the only value that starts with n
			return false
		}
		i = skipValue(body, i)
	}
	return true
}

// skipSpace returns the index of the first byte of body at or after i
// that is not JSON white space (len(body) if none).
func skipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value that starts at
// body[i], in a body known to be valid JSON.
func skipValue(body []byte, i int) int {
	depth := 0
	for ; i < len(body); i++ {
		switch body[i] {
		case '"':
			for i++; body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++ // the escaped byte, a quote perhaps
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of the object holding a scalar
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 { // the end of a scalar
				return i
			}
		}
	}
	return i
}

// errNotUTF8 is the refusal of a body with bytes that are not UTF-8, or a
// string that holds an escaped lone surrogate or U+FFFD (checkStrings).
var errNotUTF8 = errors.New("a string is not UTF-8 text: it has bytes that are not UTF-8, an escaped lone surrogate or U+FFFD")

// checkStrings refuses a body (already known to be one JSON object) with a
// string, key or value, that holds U+FFFD, the replacement character:
// encoding/json silently writes it in place of bytes that are not UTF-8
// and of an escaped lone surrogate ("\udc00"), so after decoding a broken
// string can no longer be told apart. A literal U+FFFD is refused with
// them: no field of the project needs it.
func checkStrings(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if s, ok := tok.(string); ok && strings.ContainsRune(s, utf8.RuneError) {
			return errNotUTF8
		}
	}
}

// Text reports whether s is 1..max bytes of UTF-8 text that a log line, a
// journal or a database column can hold unchanged: valid UTF-8, with no
// control character (C0 such as NUL or a newline, DEL, C1) and no U+FFFD.
// It is the one rule of the project for free text that is stored (a
// rail reference, for instance); ids keep their narrower ASCII rules.
func Text(s string, max int) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// describe names the JSON value tok starts, in JSON's words.
func describe(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		if t == '[' {
			return "an array"
		}
		return fmt.Sprintf("%q", string(t))
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "not JSON"
}

// fieldNamesOf caches fieldsOf by the type of dst: reflect.Type to
// map[string]bool, each map read only once stored.
var fieldNamesOf sync.Map

// fieldNames is fieldsOf, computed once per type of dst: a service
// decodes the same few request types for its whole life. The map it
// returns is shared and must not be written.
func fieldNames(dst any) map[string]bool {
	t := reflect.TypeOf(dst)
	if t == nil {
		return nil
	}
	if names, ok := fieldNamesOf.Load(t); ok {
		return names.(map[string]bool)
	}
	names, _ := fieldNamesOf.LoadOrStore(t, fieldsOf(dst))
	return names.(map[string]bool)
}

// fieldsOf returns the exact JSON names of the fields of the struct dst
// points to, or nil when dst is not a pointer to a struct.
func fieldsOf(dst any) map[string]bool {
	t := reflect.TypeOf(dst)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	t = t.Elem()
	names := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}

// WriteError answers with the envelope.
func WriteError(w http.ResponseWriter, status int, code, msg string, retryable bool) {
	WriteJSON(w, status, Envelope{Error: Body{Code: code, Message: msg, Retryable: retryable}})
}

// Write answers with a decoding *Error (not retryable).
func Write(w http.ResponseWriter, e *Error) {
	WriteError(w, e.Status, e.Code, e.Message, false)
}

// WriteJSON answers with v as JSON and the given status, uncacheable.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// unwrap returns the innermost writer of a chain of wrappers that have an
// Unwrap() http.ResponseWriter method.
func unwrap(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}

// Query parses r's query string strictly and returns it: a malformed pair
// (an invalid percent-escape, a ";" separator), a parameter not in
// allowed, and a parameter given more than once are errors, which the
// caller answers 400 with the envelope. (url.URL.Query drops malformed
// pairs without a word, so "?after=%zz" read as no "after" at all.) With
// no allowed parameters it is the check of a route that takes none: any
// query string with a parameter is an error, so that a client's misspelt
// or unknown parameter is refused rather than silently ignored.
func Query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query string: %v", err)
	}
	for k, v := range q {
		if len(allowed) == 0 {
			return nil, fmt.Errorf("query parameter %q: this route takes no query parameters", k)
		}
		if !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("query parameter %q is not one of %v", k, allowed)
		}
		if len(v) != 1 {
			return nil, fmt.Errorf("query parameter %q given %d times; give it once", k, len(v))
		}
	}
	return q, nil
}
