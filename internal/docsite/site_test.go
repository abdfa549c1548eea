package docsite

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// ScreenshotPath is where TestSiteSearchAndCrossReference saves its picture
// of the search results, relative to the repository's root;
// docs/site-screenshot.png is a copy of one.
const ScreenshotPath = "bin/site-screenshot.png"

// needTools skips without mkdocs (with mkdocs-material) or Chromium,
// except in CI (CI set), where .ci/run installs them and their absence is
// a failure.
func needTools(t *testing.T) (chromium string) {
	t.Helper()
	for _, bin := range []string{"mkdocs", "chromium"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not on PATH in CI (.ci/run installs Debian's mkdocs, mkdocs-material and chromium)", bin)
			}
			t.Skipf("%s not on PATH (apt-get install mkdocs mkdocs-material chromium); CI fails instead of skipping", bin)
		}
	}
	path, _ := exec.LookPath("chromium")
	return path
}

// buildSite runs the build of make docs into a temporary folder; a broken
// link or anchor fails it (hooks.py).
func buildSite(t *testing.T, ctx context.Context) string {
	t.Helper()
	site := filepath.Join(t.TempDir(), "site")
	cmd := exec.CommandContext(ctx, "mkdocs", "build", "--quiet", "--strict", "--config-file", "mkdocs.yml", "--site-dir", site)
	out, err := cmd.CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("Unrecognised theme name: 'material'")) && os.Getenv("CI") == "" {
		t.Skip("mkdocs-material not installed (apt-get install mkdocs-material); CI fails instead of skipping")
	}
	if err != nil {
		t.Fatalf("mkdocs build (make docs): %v\n%s", err, out)
	}
	return site
}

// serve serves dir on a free loopback port until the test ends.
func serve(t *testing.T, dir string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String() + "/"
}

// TestSiteSearchAndCrossReference builds the site, loads its home page in
// a headless Chromium, searches for "fencing token" and expects results,
// then follows the home page's first link into another page's section and
// expects that section's heading at the top of the window.
func TestSiteSearchAndCrossReference(t *testing.T) {
	chromium := needTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	home := serve(t, buildSite(t, ctx))
	t.Logf("site built in %v", time.Since(start).Round(time.Millisecond))

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // Chromium refuses to start as root with its sandbox
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	const query = "fencing token"
	if err := chromedp.Do(bctx,
		chromedp.Navigate(home),
		chromedp.SendKeys(chromedp.CSS(`input[data-md-component="search-query"]`), query),
	); err != nil {
		t.Fatalf("search: %v", err)
	}
	// The search index loads in a worker; the query typed before it is
	// ready is answered once it is (tens of seconds on a loaded machine).
	results, err := chromedp.Run(bctx, chromedp.Poll[int](`document.querySelectorAll(".md-search-result__item").length || false`,
		chromedp.WithPollingTimeout(2*time.Minute)))
	if err != nil {
		meta, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector(".md-search-result__meta").textContent.trim()`))
		t.Fatalf("search for %q: no results (%v); the search says %q", query, err, meta)
	}
	png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join("..", "..", ScreenshotPath)
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("search for %q: %d results after %v; screenshot %s", query, results, time.Since(start).Round(time.Millisecond), ScreenshotPath)

	// The first link of the home page's text that leads to a section of
	// another page.
	const xref = chromedp.CSS(`article a[href*=".html#"]`)
	if err := chromedp.Do(bctx, chromedp.Navigate(home)); err != nil {
		t.Fatal(err)
	}
	attr, err := chromedp.Run(bctx, chromedp.AttributeValue(xref, "href"))
	if err != nil || !strings.Contains(attr.Value, "#") {
		t.Fatalf("home page: no link to a section of another page (%v)", err)
	}
	href := attr.Value
	fragment := href[strings.Index(href, "#"):]
	type landing struct {
		Top  float64 `json:"top"`
		Y    float64 `json:"y"`
		Hash string  `json:"hash"`
	}
	loaded := chromedp.Events(bctx, page.LoadEventFired)
	if err := chromedp.Do(bctx, chromedp.Click(xref)); err != nil {
		t.Fatalf("click %s: %v", href, err)
	}
	for _, err := range loaded {
		if err != nil {
			t.Fatalf("click %s: %v", href, err)
		}
		break
	}
	// The browser scrolls to the section once the page has loaded.
	landed, err := chromedp.Run(bctx, chromedp.Poll[landing](`(() => {
		const el = document.getElementById(decodeURIComponent(location.hash.slice(1)));
		const top = el ? el.getBoundingClientRect().top : -1;
		if (el === null || window.scrollY === 0 || Math.abs(top) > window.innerHeight / 4) return false;
		return {top: top, y: window.scrollY, hash: location.hash};
	})()`, chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		t.Fatalf("followed %s: the section is not at the top of the window: %v", href, err)
	}
	url, err := chromedp.Run(bctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(url, fragment) || landed.Hash != fragment {
		t.Fatalf("followed %s: location %s, want it to end with %s", href, url, fragment)
	}
	t.Logf("followed %s: %s, scrolled to y=%.0f, the section's heading %.0f px from the top", href, url, landed.Y, landed.Top)
}
