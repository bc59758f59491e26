package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProviderHMAC is the Name of an HMAC provider.
const ProviderHMAC = "hmac"

// Defaults of HMACOptions.
const (
	DefaultSkew          = 5 * time.Minute
	DefaultReplayEntries = 100_000
)

// errHMACUsername is returned by ParseHMACUsername for a username that is
// not in the HMAC form; it wraps ErrNotMine.
var errHMACUsername = fmt.Errorf("%w: not an hmac username", ErrNotMine)

// HMACOptions configures an HMAC provider.
type HMACOptions struct {
	// ProductSecrets maps a product to the secret shared by all its
	// devices.
	ProductSecrets map[string][]byte
	// DeviceSecrets maps "<product>:<device>" to the secret of one device;
	// it wins over the product's secret.
	DeviceSecrets map[string][]byte
	// Skew is how far a signed timestamp may be from the server's clock,
	// either way. Zero means DefaultSkew.
	Skew time.Duration
	// ReplayEntries bounds the cache of (client ID, timestamp) pairs
	// already accepted within the skew window. Zero means
	// DefaultReplayEntries; negative turns replay detection off.
	ReplayEntries int
}

func (o HMACOptions) withDefaults() HMACOptions {
	if o.Skew == 0 {
		o.Skew = DefaultSkew
	}
	if o.ReplayEntries == 0 {
		o.ReplayEntries = DefaultReplayEntries
	}
	return o
}

func (o HMACOptions) validate() error {
	var errs []error
	if len(o.ProductSecrets)+len(o.DeviceSecrets) == 0 {
		errs = append(errs, errors.New("no product or device secret"))
	}
	if o.Skew < 0 {
		errs = append(errs, fmt.Errorf("negative skew %v", o.Skew))
	}
	for p, s := range o.ProductSecrets {
		if !validHMACName(p) {
			errs = append(errs, fmt.Errorf("product %q: invalid name", p))
		}
		if len(s) == 0 {
			errs = append(errs, fmt.Errorf("product %q: empty secret", p))
		}
	}
	for pd, s := range o.DeviceSecrets {
		p, d, ok := strings.Cut(pd, ":")
		if !ok || !validHMACName(p) || !validHMACName(d) {
			errs = append(errs, fmt.Errorf("device %q: want <product>:<device>", pd))
		}
		if len(s) == 0 {
			errs = append(errs, fmt.Errorf("device %q: empty secret", pd))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: hmac: %w", ErrInvalidOptions, errors.Join(errs...))
	}
	return nil
}

// validHMACName reports whether s can be a product or device name.
func validHMACName(s string) bool {
	return s != "" && ValidID(s) && !strings.Contains(s, ":")
}

// HMAC is a Provider of devices that sign their client ID and the time
// with a shared secret (Alibaba-IoT style):
//
//	username = <product>:<device>:<unix milliseconds>
//	password = base64(HMAC-SHA256(secret, <client id> + <unix milliseconds>))
//
// See the package documentation. HMAC is safe for concurrent use.
type HMAC struct {
	opts HMACOptions

	mu     sync.Mutex
	replay map[replayKey]time.Time // → when the entry may be forgotten
}

type replayKey struct {
	clientID string
	ts       int64
}

// NewHMAC returns an HMAC provider. The option maps are copied.
func NewHMAC(opts HMACOptions) (*HMAC, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	cp := func(m map[string][]byte) map[string][]byte {
		out := make(map[string][]byte, len(m))
		for k, v := range m {
			out[k] = append([]byte(nil), v...)
		}
		return out
	}
	opts.ProductSecrets, opts.DeviceSecrets = cp(opts.ProductSecrets), cp(opts.DeviceSecrets)
	return &HMAC{opts: opts, replay: make(map[replayKey]time.Time)}, nil
}

// Name returns "hmac".
func (h *HMAC) Name() string { return ProviderHMAC }

// HMACUsername returns the username a device presents to the HMAC
// provider: "<product>:<device>:<unix milliseconds>".
func HMACUsername(product, device string, ts time.Time) string {
	return product + ":" + device + ":" + strconv.FormatInt(ts.UnixMilli(), 10)
}

// SignHMAC returns the password a device presents to the HMAC provider:
// base64(HMAC-SHA256(secret, clientID + decimal unix milliseconds of ts)).
func SignHMAC(secret []byte, clientID string, ts time.Time) string {
	return base64.StdEncoding.EncodeToString(hmacSum(secret, clientID, ts.UnixMilli()))
}

func hmacSum(secret []byte, clientID string, ms int64) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(clientID))
	m.Write(strconv.AppendInt(nil, ms, 10))
	return m.Sum(nil)
}

// ParseHMACUsername splits an HMAC username into product, device and
// timestamp. The timestamp must be canonical decimal milliseconds (no
// sign, no leading zero), so that the signed message clientID+timestamp
// has one reading. An error wraps ErrNotMine.
func ParseHMACUsername(s string) (product, device string, ts time.Time, err error) {
	product, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", time.Time{}, errHMACUsername
	}
	device, msText, ok := strings.Cut(rest, ":")
	if !ok || !validHMACName(product) || !validHMACName(device) {
		return "", "", time.Time{}, errHMACUsername
	}
	if msText == "" || len(msText) > 15 || (msText[0] == '0' && msText != "0") {
		return "", "", time.Time{}, errHMACUsername
	}
	for _, c := range []byte(msText) {
		if c < '0' || c > '9' {
			return "", "", time.Time{}, errHMACUsername
		}
	}
	ms, err := strconv.ParseInt(msText, 10, 64)
	if err != nil {
		return "", "", time.Time{}, errHMACUsername
	}
	return product, device, time.UnixMilli(ms), nil
}

// secret returns the secret of a device, and whether there is one.
func (h *HMAC) secret(product, device string) ([]byte, bool) {
	if s, ok := h.opts.DeviceSecrets[product+":"+device]; ok {
		return s, true
	}
	s, ok := h.opts.ProductSecrets[product]
	return s, ok
}

// Authenticate recognises a username in the HMAC form whose product or
// device has a secret, and checks the signature, the timestamp's skew and
// that the pair (client ID, timestamp) was not accepted before. The
// Identity's Username is "<product>:<device>".
func (h *HMAC) Authenticate(r *Request) (Identity, error) {
	product, device, ts, err := ParseHMACUsername(r.Username)
	if err != nil {
		return Identity{}, err
	}
	secret, ok := h.secret(product, device)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no secret for device %s:%s", ErrNotMine, product, device)
	}
	now := r.now()
	if d := now.Sub(ts); d > h.opts.Skew || d < -h.opts.Skew {
		return Identity{}, fmt.Errorf("%w: timestamp outside allowed skew", ErrDenied)
	}
	got := make([]byte, base64.StdEncoding.DecodedLen(len(r.Password)))
	n, err := base64.StdEncoding.Decode(got, r.Password)
	if err != nil || n != sha256.Size {
		return Identity{}, fmt.Errorf("%w: password is not a base64 hmac-sha256", ErrDenied)
	}
	if !hmac.Equal(got[:n], hmacSum(secret, r.ClientID, ts.UnixMilli())) {
		return Identity{}, fmt.Errorf("%w: bad signature for device %s:%s", ErrDenied, product, device)
	}
	if !h.firstUse(r.ClientID, ts, now) {
		return Identity{}, fmt.Errorf("%w: timestamp already used (replay)", ErrDenied)
	}
	return Identity{ClientID: r.ClientID, Username: product + ":" + device, Provider: ProviderHMAC}, nil
}

// firstUse records (clientID, ts) and reports whether it was not recorded
// before. Entries are kept until ts+skew, after which the skew check
// refuses the timestamp anyway. When the cache is full, expired entries
// are pruned, then an arbitrary one is evicted.
func (h *HMAC) firstUse(clientID string, ts, now time.Time) bool {
	if h.opts.ReplayEntries < 0 {
		return true
	}
	k := replayKey{clientID: clientID, ts: ts.UnixMilli()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, seen := h.replay[k]; seen {
		return false
	}
	if len(h.replay) >= h.opts.ReplayEntries {
		for k, until := range h.replay {
			if now.After(until) {
				delete(h.replay, k)
			}
		}
		for len(h.replay) >= h.opts.ReplayEntries {
			for k := range h.replay {
				delete(h.replay, k)
				break
			}
		}
	}
	h.replay[k] = ts.Add(h.opts.Skew)
	return true
}
