// Package httpjson holds the JSON-over-HTTP plumbing every service of the
// project shares: strict request decoding and the uniform error envelope
// {"error":{"code","message","retryable"}}. Each service keeps its own list
// of codes; this package only knows the three that decoding itself produces.
package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
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
	Error Body `json:"error"`
}

// Body is the content of an Envelope: a stable code, a message for people,
// and whether the same request may succeed later.
type Body struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// Error is a refused request body: the status and code to answer with.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Decode reads exactly one JSON object of at most limit bytes into dst,
// refusing a Content-Type other than application/json (a missing one is
// accepted), unknown fields, and anything after the object. It returns nil
// or an *Error to answer with (see Write).
func Decode(w http.ResponseWriter, r *http.Request, dst any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return &Error{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, fmt.Sprintf("content type %q; send application/json", ct)}
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return nil
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return &Error{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("body larger than %d bytes", limit)}
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("empty body; send a JSON object")
	}
	return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + err.Error()}
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
