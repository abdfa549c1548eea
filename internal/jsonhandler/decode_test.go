package jsonhandler

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// threePasses is decodeBody as it was before plainObject, mayHoldRuneError
// and fieldNames: every check on every body, and the field
// names found by reflection at each call. decodeBody must answer exactly as it
// does (FuzzDecodeBodyMatchesThreePasses).
func threePasses(body []byte, dst any, refuseNull bool) *Error {
	if !utf8.Valid(body) {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + errNotUTF8.Error()}
	}
	if err := checkObject(body, fieldsOf(dst), refuseNull); err != nil {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + jsonProblem(err)}
	}
	if err := checkStrings(body); err != nil {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return &Error{http.StatusBadRequest, CodeInvalidRequest, "malformed request body: " + jsonProblem(err)}
	}
	return nil
}

// nested is a destination with strings at every depth: keys and values of
// a map, items of a slice, a nested object, and an any.
type nested struct {
	Owner string            `json:"owner"`
	TTLMs int64             `json:"ttlMs"`
	Tags  []string          `json:"tags"`
	Attrs map[string]string `json:"attrs"`
	Inner *struct {
		Note string `json:"note"`
	} `json:"inner"`
	Any any `json:"any"`
}

// FuzzDecodeBodyMatchesThreePasses: for any body, into a flat, a nested
// and a map destination, with and without refusing null, decodeBody
// accepts exactly what threePasses accepts, fills the destination the same
// way, and refuses with the same status, code and message.
func FuzzDecodeBodyMatchesThreePasses(f *testing.F) {
	for _, s := range []string{
		`{"owner":"a","ttlMs":1000}`, `{}`, `null`, `[]`, `"x"`, ``, `{"OWNER":"a"}`,
		`{"owner":"a","owner":"b"}`, `{"owner":"a","extra":1}`, `{"owner":"a"} {}`, `{"owner":"a"`,
		`{"ttlMs":"5"}`, `{"owner":"a",}`, `{"owner":null}`, "{\"owner\":\"a\xffb\"}",
		`{"owner":"\udc00"}`, `{"owner":"\ud800x"}`, `{"owner":"\ud800\udc00"}`, `{"owner":"�"}`,
		`{"owner":"\ufffd"}`, `{"owner":"\uFFFD"}`, `{"owner":"\uFfFd"}`, `{"owner":"\\ufffd"}`,
		`{"owner":"C:\\users"}`, `{"owner":"\\\udc00"}`, `{"\udc00":1}`, `{"own\u0065r":"a"}`,
		`{"tags":["a","\udc00"]}`, `{"attrs":{"\udfff":"x"}}`, `{"inner":{"note":"\ufffd"}}`,
		`{"any":[{"k":"\ud83d\ude00"}]}`, `{"any":{"x":[1,"\udc00"]}}`, `{"owner":"é😀","ttlMs":1}`,
		`{"owner":"a\nb"}`, `{"owner":"a"}` + "\xff", `{"any":"\u00e9"}`, `{"ttlMs":1e3}`,
		// Shapes that plainObject must read right or leave to checkObject.
		`{"owner":"a}\"{,","ttlMs":1}`, "\t{ \"owner\" :\n\"x\" ,\r\"ttlMs\" : 5 }\n",
		`{"any":{"a":"}","b":[1,{"c":"\"]"}],"d":null},"owner":"o"}`, `{"ow\"ner":"a"}`, `{"own\\er":"a"}`,
		`{"any":null}`, `{"any":nul}`, `{"ttlMs":-0.5e-3,"owner":""}`, `{"any":[]}`, `{"any":{}}`,
		`{"owner":"a","ttlMs":1,"owner":"b"}`, `{"any":true,"tags":[],"attrs":{"k":"v"},"inner":{"note":"n"}}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"a":17}`,
		`{"any":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, `{"owner":"a"}{`, `{"owner":"a"} x`,
		"\ufeff{}", `{"owner":"a"}` + "\x00", `{"a":1,"\u0061":2}`, `{"owner":"a","\u006fwner":"b"}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, refuseNull bool) {
		for _, fresh := range []func() any{
			func() any { return &req{} },
			func() any { return &nested{} },
			func() any { return &map[string]any{} }, // no field names: any key, once
		} {
			got, want := fresh(), fresh()
			gotErr := decodeBody([]byte(body), got, refuseNull)
			wantErr := threePasses([]byte(body), want, refuseNull)
			if !reflect.DeepEqual(gotErr, wantErr) {
				t.Fatalf("decodeBody(%q, %T, refuseNull %v) = %v; three passes say %v", body, got, refuseNull, gotErr, wantErr)
			}
			if wantErr == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeBody(%q) into %T = %+v; three passes fill %+v", body, got, got, want)
			}
		}
	})
}

// TestEscapedBackslashBeforeUIsText: a "\\u" in a string is a backslash
// and a u, not an escape; it is accepted as text, while the escapes that
// decode to U+FFFD, in any case of their hex digits, are refused.
func TestEscapedBackslashBeforeUIsText(t *testing.T) {
	for body, want := range map[string]string{
		`{"owner":"C:\\users"}`:         `C:\users`,
		`{"owner":"\\ufffd"}`:           `\ufffd`,
		`{"owner":"\\udc00","ttlMs":1}`: `\udc00`,
	} {
		var got req
		if err := decodeBody([]byte(body), &got, false); err != nil || got.Owner != want {
			t.Errorf("decodeBody(%s) = %v, owner %q; want nil, %q", body, err, got.Owner, want)
		}
	}
	for _, body := range []string{`{"owner":"\uFFFD"}`, `{"owner":"\uFfFd"}`, `{"owner":"\\\udc00"}`, `{"owner":"\uDC00"}`} {
		if err := decodeBody([]byte(body), &req{}, false); err == nil || !strings.Contains(err.Message, "not UTF-8") {
			t.Errorf("decodeBody(%s) = %v; want the not-UTF-8 refusal", body, err)
		}
	}
}

// TestFieldNamesArePerType: the names remembered for one destination type
// never judge the keys of another.
func TestFieldNamesArePerType(t *testing.T) {
	type other struct {
		Token int64 `json:"token"`
	}
	for range 2 {
		if err := decodeBody([]byte(`{"owner":"a"}`), &req{}, false); err != nil {
			t.Fatalf("owner into req: %v", err)
		}
		if err := decodeBody([]byte(`{"owner":"a"}`), &other{}, false); err == nil || !strings.Contains(err.Message, `unknown field "owner"`) {
			t.Fatalf("owner into a type without it: %v; want unknown field", err)
		}
		if err := decodeBody([]byte(`{"token":1}`), &other{}, false); err != nil {
			t.Fatalf("token into other: %v", err)
		}
	}
}
