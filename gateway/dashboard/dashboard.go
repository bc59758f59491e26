package dashboard

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"
)

// AssetPrefix is the path under which the page's script and stylesheet are
// served; the page itself is served at exactly "/".
const AssetPrefix = "/dashboard/"

//go:embed assets
var assets embed.FS

// Options configure the page. A zero field means its default.
type Options struct {
	// StatsPath is the same-origin path of the /stats JSON the page polls;
	// default "/stats". It must start with "/" (Handler panics otherwise,
	// as http.ServeMux.Handle does on a bad pattern).
	StatsPath string
	// Interval is the time between polls; default 1 s, at least 100 ms.
	Interval time.Duration
	// Window is how much history the charts keep; default 2 min, at least
	// ten intervals.
	Window time.Duration
	// Title names the page; default "ferrymq".
	Title string
}

func (o Options) withDefaults() Options {
	if o.StatsPath == "" {
		o.StatsPath = "/stats"
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	o.Interval = max(o.Interval, 100*time.Millisecond)
	if o.Window == 0 {
		o.Window = 2 * time.Minute
	}
	o.Window = max(o.Window, 10*o.Interval)
	if o.Title == "" {
		o.Title = "ferrymq"
	}
	return o
}

// Handler serves the dashboard page at exactly "/" (GET /{$}) and its
// assets under AssetPrefix. Mount it for those two patterns, beside the
// handler that serves opts.StatsPath.
func Handler(opts Options) http.Handler {
	opts = opts.withDefaults()
	if !strings.HasPrefix(opts.StatsPath, "/") || strings.HasPrefix(opts.StatsPath, "//") {
		panic(fmt.Sprintf("dashboard: StatsPath %q is not a same-origin absolute path", opts.StatsPath))
	}
	page, err := renderPage(opts)
	if err != nil {
		panic(err) // the embedded template is part of the binary: a bug
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	files := http.StripPrefix(strings.TrimSuffix(AssetPrefix, "/"), http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		secure(w.Header())
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET "+AssetPrefix+"{file}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("file") == "index.html" { // only as "/", rendered
			http.NotFound(w, r)
			return
		}
		secure(w.Header())
		files.ServeHTTP(w, r)
	})
	return mux
}

// secure sets the headers that keep the page to its own origin.
func secure(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

func renderPage(o Options) ([]byte, error) {
	t, err := template.ParseFS(assets, "assets/index.html")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]any{
		"Title":    o.Title,
		"Stats":    o.StatsPath,
		"Interval": o.Interval.Milliseconds(),
		"Window":   o.Window.Milliseconds(),
		"Assets":   AssetPrefix,
	})
	return b.Bytes(), err
}
