package node

import "net/http"

// routeMux is the HTTP server's ServeMux, keeping the patterns registered
// on it in order: a ServeMux cannot list them, and the test that holds
// docs/openapi.yaml to the routes needs them.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}
