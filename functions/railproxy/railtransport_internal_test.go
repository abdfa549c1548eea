package railproxy

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The rail transport speaks HTTP/1.1 even to a TLS server that offers
// HTTP/2, whose client resends a POST after a PROTOCOL_ERROR reset.
func TestRailCallsNeverUseHTTP2(t *testing.T) {
	var proto string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto = r.Proto
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	// The test server's own client does negotiate HTTP/2: the server
	// offers it.
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if proto != "HTTP/2.0" {
		t.Fatalf("the test server was reached over %s; want HTTP/2.0, or the test shows nothing", proto)
	}

	tr := newRailTransport()
	tr.TLSClientConfig = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	resp, err = (&http.Client{Transport: tr}).Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if proto != "HTTP/1.1" || resp.ProtoMajor != 1 {
		t.Errorf("the rail transport reached the rail over %s (answer %s); want HTTP/1.1 only", proto, resp.Proto)
	}
}
