package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRecordRoundTrip(t *testing.T) {
	b := appendRecord(nil, opPut, "c/car-7", []byte(`{"id":"car-7"}`))
	b = appendRecord(b, opDelete, "s/car-7\x00a/b", nil)
	op, key, val, n, err := decodeRecord(b)
	require.NoError(t, err)
	require.Equal(t, byte(opPut), op)
	require.Equal(t, "c/car-7", key)
	require.Equal(t, `{"id":"car-7"}`, string(val))
	op, key, val, m, err := decodeRecord(b[n:])
	require.NoError(t, err)
	require.Equal(t, byte(opDelete), op)
	require.Equal(t, "s/car-7\x00a/b", key)
	require.Empty(t, val)
	require.Equal(t, len(b), n+m)
}

func TestDecodeRejectsDamage(t *testing.T) {
	good := appendRecord(nil, opPut, "k", []byte("value"))
	for name, mutate := range map[string]func([]byte) []byte{
		"truncated":   func(b []byte) []byte { return b[:len(b)-1] },
		"bad magic":   func(b []byte) []byte { b[0] = 0; return b },
		"bit flip":    func(b []byte) []byte { b[len(b)-1] ^= 1; return b },
		"huge length": func(b []byte) []byte { b[8] = 0x7F; return b },
		"bad op":      func(b []byte) []byte { b[9] = 9; return fixCRC(b) },
		"key too long": func(b []byte) []byte {
			b[10], b[11] = 0xFF, 0xFF
			return fixCRC(b)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, _, err := decodeRecord(mutate(append([]byte(nil), good...)))
			require.ErrorIs(t, err, errBadRecord)
		})
	}
}

func fixCRC(b []byte) []byte {
	crc := checksum(b[recHeader:])
	b[1], b[2], b[3], b[4] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	return b
}

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// put writes a record as the hooks would and indexes it as Open does.
func (s *Store) put(key string, v storage.Serializable) {
	b, err := v.MarshalBinary()
	if err != nil {
		panic(err)
	}
	if m, ok := v.(*storage.Message); ok && strings.HasPrefix(key, kInflight) {
		if b, err = encodeMsg(m, 0); err != nil {
			panic(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.putLocked(key, b)
	if err != nil {
		panic(err)
	}
	s.live -= int64(e.n) // apply counts it
	s.apply(opPut, key, b, e)
}

func (s *Store) delClient(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.sessions[id]; ss != nil {
		s.dropLocked(ss, true)
	}
}

func TestStoreReloads(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	s.put(clientKey("a"), &storage.Client{ID: "a", T: storage.ClientKey})
	s.put(clientKey("b"), &storage.Client{ID: "b", T: storage.ClientKey})
	s.put(subKey("a", "x/#"), &storage.Subscription{ID: subKey("a", "x/#"), Client: "a", Filter: "x/#", Qos: 1})
	s.put(inflightKey("a", 7), &storage.Message{ID: inflightKey("a", 7), Client: "a", PacketID: 7, Payload: []byte("p")})
	s.put(retainedKey("t"), &storage.Message{ID: retainedKey("t"), TopicName: "t", Payload: []byte("r")})
	s.delClient("b")
	require.NoError(t, s.Close())

	s = open(t, dir)
	cls, err := s.StoredClients()
	require.NoError(t, err)
	require.Len(t, cls, 1)
	require.Equal(t, "a", cls[0].ID)
	subs, _ := s.StoredSubscriptions()
	require.Len(t, subs, 1)
	ifm, _ := s.StoredInflightMessages()
	require.Len(t, ifm, 1)
	require.Equal(t, uint16(7), ifm[0].PacketID)
	ret, _ := s.StoredRetainedMessages()
	require.Len(t, ret, 1)

	s.delClient("a") // its subscription and inflight message go too
	require.NoError(t, s.Close())
	s = open(t, dir)
	cls, _ = s.StoredClients()
	subs, _ = s.StoredSubscriptions()
	ifm, _ = s.StoredInflightMessages()
	require.Empty(t, cls)
	require.Empty(t, subs)
	require.Empty(t, ifm)
}

// A damaged record in the middle drops that session only; a torn tail is
// cut and later writes land after the last good record.
func TestStoreSurvivesDamage(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, id := range []string{"a", "b", "c"} {
		s.put(clientKey(id), &storage.Client{ID: id, T: storage.ClientKey})
	}
	require.NoError(t, s.Close())
	path := filepath.Join(dir, "sessions.log")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	_, _, _, n, err := decodeRecord(b)
	require.NoError(t, err)
	b[n+recHeader+5] ^= 0xFF                                                     // damage the second record ("b")
	b = append(b, appendRecord(nil, opPut, "c/d", []byte(`{"id":"d"}`))[:20]...) // and a torn tail
	require.NoError(t, os.WriteFile(path, b, 0o644))

	s = open(t, dir)
	cls, _ := s.StoredClients()
	var ids []string
	for _, c := range cls {
		ids = append(ids, c.ID)
	}
	require.ElementsMatch(t, []string{"a", "c"}, ids)
	s.put(clientKey("e"), &storage.Client{ID: "e", T: storage.ClientKey})
	require.NoError(t, s.Close())
	s = open(t, dir)
	cls, _ = s.StoredClients()
	require.Len(t, cls, 3, "a, c and e")
}

func TestStoreCompacts(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	big := make([]byte, 64<<10)
	for i := range 40 { // 2.5 MiB written, one live record
		s.put(retainedKey("t"), &storage.Message{ID: retainedKey("t"), TopicName: "t", Payload: big, Created: int64(i)})
	}
	s.mu.Lock()
	require.NoError(t, s.lg.compact())
	size := s.lg.bytes
	s.mu.Unlock()
	require.Less(t, size, int64(200<<10))
	require.NoError(t, s.Close())
	s = open(t, dir)
	ret, _ := s.StoredRetainedMessages()
	require.Len(t, ret, 1)
	require.Equal(t, int64(39), ret[0].Created)
}

// FuzzReplay: replaying arbitrary bytes never panics and every record it
// yields is one that decodes.
func FuzzReplay(f *testing.F) {
	f.Add(appendRecord(appendRecord(nil, opPut, "c/a", []byte("{}")), opDelete, "c/a", nil))
	f.Add([]byte{recMagic, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		replay(b, func(op byte, key string, value []byte, off int64) {
			_, k, _, _, err := decodeRecord(b[off:])
			require.NoError(t, err)
			require.Equal(t, key, k)
		}, func(int64, error) {})
	})
}

// FuzzDecodeValues: the decoders of stored message and subscription values
// never panic on arbitrary bytes, and what they accept re-encodes.
func FuzzDecodeValues(f *testing.F) {
	m := &storage.Message{ID: "i/a\x00\x00\x07", Client: "a", TopicName: "t/1", Payload: []byte("p"), PacketID: 7}
	v, err := encodeMsg(m, 1700000000)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v)
	js, _ := m.MarshalBinary()
	f.Add(js)
	sub, _ := (&storage.Subscription{Filter: "x/#", Qos: 1}).MarshalBinary()
	f.Add(sub)
	f.Add([]byte{msgVersion, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, expiry, err := decodeMsg(b); err == nil {
			require.GreaterOrEqual(t, expiry, int64(0))
			again, err := encodeMsg(&m, expiry)
			require.NoError(t, err)
			m2, e2, err := decodeMsg(again)
			require.NoError(t, err)
			require.Equal(t, expiry, e2)
			require.Equal(t, m.Payload, m2.Payload)
		}
		if r, err := decodeSubRef("x/#", b); err == nil {
			require.Equal(t, "x/#", r.filter)
			require.LessOrEqual(t, r.qos, byte(2))
		}
	})
}
