//go:build ignore

// Command gen writes the test certificates in testdata/tls: a CA, a server
// certificate for localhost and 127.0.0.1 signed by it, a client certificate
// signed by it, and a client certificate signed by a second, untrusted CA.
// All keys are ECDSA P-256; all certificates are valid for 20 years.
//
// Run from the repository root:
//
//	go run testdata/tls/gen/main.go
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

const validity = 20 * 365 * 24 * time.Hour

type issued struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func main() {
	dir := flag.String("dir", "testdata/tls", "directory to write the PEM files to")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	now := time.Now().Add(-time.Hour).Truncate(time.Hour)

	ca, err := issue(nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "ferrymq test CA"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}, now)
	if err != nil {
		return err
	}
	server, err := issue(&ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, now)
	if err != nil {
		return err
	}
	client, err := issue(&ca, clientTemplate("ferrymq test client"), now)
	if err != nil {
		return err
	}
	otherCA, err := issue(nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "ferrymq untrusted test CA"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}, now)
	if err != nil {
		return err
	}
	untrusted, err := issue(&otherCA, clientTemplate("ferrymq untrusted test client"), now)
	if err != nil {
		return err
	}

	for name, is := range map[string]issued{
		"ca":               ca,
		"server":           server,
		"client":           client,
		"client-untrusted": untrusted,
	} {
		if err := write(dir, name, is, name != "ca"); err != nil {
			return err
		}
	}
	return nil
}

func clientTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// issue makes a key and a certificate from tmpl, signed by parent, or
// self-signed when parent is nil.
func issue(parent *issued, tmpl *x509.Certificate, now time.Time) (issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return issued{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return issued{}, fmt.Errorf("serial: %w", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now
	tmpl.NotAfter = now.Add(validity)

	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return issued{}, fmt.Errorf("certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return issued{}, fmt.Errorf("parse %s: %w", tmpl.Subject.CommonName, err)
	}
	return issued{cert: cert, key: key}, nil
}

// write stores name.pem, and name-key.pem when withKey is set. The CA keys
// are not kept: regenerating makes a new CA.
func write(dir, name string, is issued, withKey bool) error {
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.cert.Raw})
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), certPEM, 0o644); err != nil {
		return err
	}
	if !withKey {
		return nil
	}
	der, err := x509.MarshalPKCS8PrivateKey(is.key)
	if err != nil {
		return fmt.Errorf("marshal %s key: %w", name, err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return os.WriteFile(filepath.Join(dir, name+"-key.pem"), keyPEM, 0o600)
}
