package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/ferrymq/ferrymq/gateway/node"
)

// readTokenFile returns the token serve wrote into dataDir, or "".
func readTokenFile(dataDir string) string {
	b, err := os.ReadFile(filepath.Join(dataDir, node.TokenFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
