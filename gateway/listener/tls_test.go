package listener

import (
	"crypto/tls"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadTLS(t *testing.T) {
	cfg, err := LoadTLS(tlsFile("server.pem"), tlsFile("server-key.pem"), "")
	require.NoError(t, err)
	require.Len(t, cfg.Certificates, 1)
	require.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
	require.Equal(t, tls.NoClientCert, cfg.ClientAuth)

	cfg, err = LoadTLS(tlsFile("server.pem"), tlsFile("server-key.pem"), tlsFile("ca.pem"))
	require.NoError(t, err)
	require.Equal(t, tls.RequireAndVerifyClientCert, cfg.ClientAuth)
	require.NotNil(t, cfg.ClientCAs)
}

func TestLoadTLSErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		is            error
		mentions      string
	}{
		{name: "missing cert", cert: missing, key: "server-key.pem", is: fs.ErrNotExist, mentions: missing},
		{name: "missing key", cert: "server.pem", key: missing, is: fs.ErrNotExist, mentions: missing},
		{name: "no PEM in key", cert: "server.pem", key: "README.md", mentions: "README.md"},
		{name: "key of another cert", cert: "server.pem", key: "client-key.pem", mentions: "client-key.pem"},
		{name: "missing ca", cert: "server.pem", key: "server-key.pem", ca: missing, is: fs.ErrNotExist, mentions: missing},
		{name: "no cert in ca", cert: "server.pem", key: "server-key.pem", ca: "server-key.pem", is: ErrNoCertificates, mentions: "server-key.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := func(name string) string {
				if name == "" || filepath.IsAbs(name) {
					return name
				}
				return tlsFile(name)
			}
			_, err := LoadTLS(path(tc.cert), path(tc.key), path(tc.ca))
			require.Error(t, err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			require.ErrorContains(t, err, tc.mentions)
		})
	}
}
