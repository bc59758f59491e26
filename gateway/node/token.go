package node

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
)

// TokenFile, in the data folder, is where a node writes the token it
// generated, and where the CLI looks for one when neither --token nor
// FERRYMQ_TOKEN is given.
const TokenFile = "token"

// loopbackOnly reports whether addr (host:port) listens on loopback only;
// an empty host means every interface.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ensureToken makes sure backends and operators need a token when the core
// port or the HTTP API listen beyond loopback: with no token configured, a
// random one is generated and written to <data>/token (mode 0600), which
// the CLI reads. It returns the token ("" when none is needed) and whether
// it was generated.
func ensureToken(token, dataDir string, addrs ...string) (string, bool, error) {
	if token != "" {
		return token, false, nil
	}
	exposed := false
	for _, a := range addrs {
		if a != "" && !loopbackOnly(a) {
			exposed = true
		}
	}
	if !exposed {
		return "", false, nil
	}
	token, err := newToken()
	if err != nil {
		return "", false, err
	}
	return token, true, writeTokenFile(dataDir, token)
}

// newToken generates a token: 24 random bytes in hex.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeTokenFile writes token into dataDir for the CLI to find.
func writeTokenFile(dataDir, token string) error {
	path := filepath.Join(dataDir, TokenFile)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("token: %w", err)
	}
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("write token: %w", err)
	}
	return nil
}

// requireToken guards an HTTP handler: the request must carry
// "Authorization: Bearer <token>" (compared in constant time).
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferrymq"`)
			http.Error(w, errors.New("a token is required: Authorization: Bearer <token>").Error(), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
