package session

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

func TestMain(m *testing.M) {
	maybeChild()
	goleak.VerifyTestMain(m)
}

func openStore(t testing.TB, dir string, o ...Options) *Store {
	t.Helper()
	var opts Options
	if len(o) > 0 {
		opts = o[0]
	}
	s, err := Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func load(t testing.TB, s *Store) ([]engine.StoredSession, []*engine.Message) {
	t.Helper()
	ss, ret, err := s.Load()
	require.NoError(t, err)
	return ss, ret
}

// fill stores one session of every kind of record, as the engine would.
func fill(s *Store, id string) {
	s.SaveClient(engine.ClientRecord{ID: id, Username: "u-" + id, Protocol: 5, Expiry: 3600, Will: fullMessage(), WillDelay: 2, WillExpiry: 9})
	s.SaveSubscription(id, "cmd/"+id, topictree.Options{QoS: 1})
	s.SaveSubscription(id, "all/#", topictree.Options{QoS: 2, NoLocal: true, Identifier: 4})
	for pid := uint16(1); pid <= 3; pid++ {
		m := fullMessage()
		m.Payload = []byte{byte('a' + pid - 1)}
		s.SaveMessage(id, pid, m, []uint32{4})
	}
	s.MessageReleased(id, 2)
	s.SaveInbound(id, 9, 1_800_000_000_000_000_009, true)
	s.SaveInbound(id, 10, 1_800_000_000_000_000_010, true) // taken, not answered
	s.SaveInbound(id, 11, 1_800_000_000_000_000_011, true)
	s.SaveInbound(id, 11, 0, true) // answered
	s.SaveInbound(id, 9, 0, false)
	s.SaveOffline(id, time.Unix(1_800_000_000, 0))
}

// wantInbound is what fill leaves of the inbound QoS 2 packet IDs: 10
// taken under its QoS2ID, 11 answered.
var wantInbound = []engine.StoredInbound{{PID: 10, QoS2ID: 1_800_000_000_000_000_010}, {PID: 11}}

func wantFilled(t testing.TB, st engine.StoredSession, id string) {
	t.Helper()
	require.Equal(t, id, st.Client.ID)
	require.Equal(t, "u-"+id, st.Client.Username)
	require.Equal(t, fullMessage(), st.Client.Will)
	require.Equal(t, uint32(2), st.Client.WillDelay)
	require.True(t, time.Unix(1_800_000_000, 0).Equal(st.Offline))
	require.Equal(t, []engine.StoredSubscription{
		{Filter: "cmd/" + id, Options: topictree.Options{QoS: 1}},
		{Filter: "all/#", Options: topictree.Options{QoS: 2, NoLocal: true, Identifier: 4}},
	}, st.Subscriptions)
	require.Len(t, st.Messages, 3)
	for i, sm := range st.Messages {
		require.Equal(t, uint16(i+1), sm.PID)
		require.Equal(t, string(rune('a'+i)), string(sm.Message.Payload), "in the order stored")
		require.Equal(t, []uint32{4}, sm.SubIDs)
		require.Equal(t, i == 1, sm.Released)
	}
	require.Equal(t, wantInbound, st.Inbound)
}

func TestStoreKeepsEverythingAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	fill(s, "car-7")
	fill(s, "car-8")
	s.SaveRetained(fullMessage())
	s.SaveRetained(&engine.Message{Topic: "gone", Payload: []byte("x")})
	s.SaveRetained(&engine.Message{Topic: "gone"})
	s.Delete("car-8")
	s.DeleteMessage("car-7", 3)
	require.NoError(t, s.Close())

	s = openStore(t, dir)
	sessions, retained := load(t, s)
	require.Len(t, sessions, 1)
	require.Len(t, sessions[0].Messages, 2, "message 3 was acknowledged")
	require.Equal(t, []*engine.Message{fullMessage()}, retained)
	msgs, err := s.LoadMessages("car-7")
	require.NoError(t, err)
	require.Equal(t, sessions[0].Messages, msgs, "LoadMessages reads what Load does")
	st := sessions[0]
	require.Equal(t, "u-car-7", st.Client.Username)
	require.Equal(t, wantInbound, st.Inbound)
	require.True(t, st.Messages[1].Released)
	require.Equal(t, Stats{Sessions: 1, Messages: 2, Retained: 1}, pick(s.Stats()))
}

// pick keeps the figures a test compares.
func pick(st Stats) Stats {
	return Stats{Sessions: st.Sessions, Messages: st.Messages, Retained: st.Retained}
}

func TestLoadReturnsEveryRecordKind(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	fill(s, "car-7")
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	sessions, _ := load(t, s)
	require.Len(t, sessions, 1)
	wantFilled(t, sessions[0], "car-7")
}

// A session connected when the process ended loads as offline-unknown
// (zero: its will is due, its expiry counts from the start) once; Load
// writes it offline from then, so that a second restart does neither
// again.
func TestLoadMarksSessionsThatDiedOnlineOffline(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	s.SaveClient(engine.ClientRecord{ID: "a", Protocol: 4, Expiry: 60})
	s.SaveOffline("a", time.Unix(1000, 0))
	s.SaveClient(engine.ClientRecord{ID: "a", Protocol: 4, Expiry: 60}) // connected again: online
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	before := time.Now()
	sessions, _ := load(t, s)
	require.True(t, sessions[0].Offline.IsZero(), "connected when the process ended")
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	sessions, _ = load(t, s)
	require.False(t, sessions[0].Offline.Before(before), "offline from the first start")
}

// A client record that starts a session drops whatever an earlier session
// of the ID left, even if the delete between them was lost.
func TestNewSessionDropsLeftoversOfALostDelete(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	fill(s, "a")
	s.mu.Lock()
	end := s.lg.size
	s.mu.Unlock()
	s.Delete("a")
	s.SaveClient(engine.ClientRecord{ID: "a", Protocol: 4, Expiry: 60})
	s.SaveSubscription("a", "new", topictree.Options{QoS: 1})
	require.NoError(t, s.Close())
	path := filepath.Join(dir, logName)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[end+recHeader+2] ^= 0xFF // damage the delete
	require.NoError(t, os.WriteFile(path, b, 0o644))

	s = openStore(t, dir)
	sessions, _ := load(t, s)
	require.Len(t, sessions, 1)
	require.Equal(t, []engine.StoredSubscription{{Filter: "new", Options: topictree.Options{QoS: 1}}}, sessions[0].Subscriptions)
	require.Empty(t, sessions[0].Messages)
	require.Empty(t, sessions[0].Inbound)
}

// Writes for a session the store does not have are not stored (the engine
// writes a session's client record first).
func TestWritesOfUnknownSessionsAreRefused(t *testing.T) {
	s := openStore(t, t.TempDir())
	s.SaveSubscription("nobody", "x", topictree.Options{QoS: 1})
	s.SaveMessage("nobody", 1, fullMessage(), nil)
	s.Delete("nobody")
	s.DeleteMessage("nobody", 1)
	st := s.Stats()
	require.Equal(t, int64(3), st.WriteErrors[reasonUnknownSession], "the subscription, the message, its ack")
	require.Zero(t, st.Sessions)
	msgs, err := s.LoadMessages("nobody")
	require.NoError(t, err)
	require.Empty(t, msgs)
}

// TestTornTailEveryOffset: a crash mid-write leaves any prefix of the last
// record; every one of them is cut off at Open, everything before it
// loads, and the next record lands where the torn one began.
func TestTornTailEveryOffset(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	fill(s, "a")
	s.mu.Lock()
	before := s.lg.size
	s.mu.Unlock()
	s.SaveSubscription("a", "last/one", topictree.Options{QoS: 1})
	require.NoError(t, s.Close())
	path := filepath.Join(dir, logName)
	full, err := os.ReadFile(path)
	require.NoError(t, err)
	for cut := before; cut < int64(len(full)); cut++ {
		require.NoError(t, os.WriteFile(path, full[:cut], 0o644))
		s, err := Open(dir, Options{})
		require.NoError(t, err, "cut at %d", cut)
		sessions, _, err := s.Load()
		require.NoError(t, err)
		require.Len(t, sessions, 1, "cut at %d", cut)
		wantFilled(t, sessions[0], "a")
		s.SaveSubscription("a", "after/cut", topictree.Options{QoS: 1})
		require.NoError(t, s.Close())
		s, err = Open(dir, Options{})
		require.NoError(t, err)
		sessions, _, err = s.Load()
		require.NoError(t, err)
		require.Len(t, sessions[0].Subscriptions, 3, "cut at %d: the write after the cut loads", cut)
		require.Equal(t, "after/cut", sessions[0].Subscriptions[2].Filter)
		require.NoError(t, s.Close())
	}
}

// A damaged record in the middle of the log loses that record only.
func TestDamagedRecordLosesOnlyItself(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, id := range []string{"a", "b", "c"} {
		fill(s, id)
	}
	// The location of b's second subscription.
	s.mu.Lock()
	at := s.ix.sessions["b"].subs[1].at
	s.mu.Unlock()
	require.NoError(t, s.Close())
	path := filepath.Join(dir, logName)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[at.off+int64(at.n)-1] ^= 0x40
	require.NoError(t, os.WriteFile(path, b, 0o644))

	s = openStore(t, dir)
	sessions, _ := load(t, s)
	require.Len(t, sessions, 3)
	wantFilled(t, sessions[0], "a")
	wantFilled(t, sessions[2], "c")
	require.Equal(t, []engine.StoredSubscription{{Filter: "cmd/b", Options: topictree.Options{QoS: 1}}}, sessions[1].Subscriptions)
	require.Len(t, sessions[1].Messages, 3, "b's other records load")
}

// The log of the mochi-based store (its first byte 0xF5, no header) is set
// aside as sessions.log.v1, untouched, and a new log begins; another file
// is refused, not replayed as damage.
func TestOpenSetsAsideThePreviousFormat(t *testing.T) {
	dir := t.TempDir()
	old := []byte{0xF5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	require.NoError(t, os.WriteFile(filepath.Join(dir, logName), old, 0o644))
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	sessions, _ := load(t, s)
	require.Empty(t, sessions)
	require.NoError(t, s.Close())
	kept, err := os.ReadFile(filepath.Join(dir, logName+".v1"))
	require.NoError(t, err)
	require.Equal(t, old, kept)
	s, err = Open(dir, Options{}) // the new log opens as one
	require.NoError(t, err)
	require.NoError(t, s.Close())

	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, logName), []byte("not a session log at all"), 0o644))
	_, err = Open(other, Options{})
	require.ErrorIs(t, err, ErrNotSessionLog)
}

func TestOptionsAreValidated(t *testing.T) {
	_, err := Open(t.TempDir(), Options{SyncInterval: -1, CompactBytes: -1})
	require.ErrorContains(t, err, "sync interval")
	require.ErrorContains(t, err, "compact bytes")
}

// Records are fsynced within SyncInterval of being written.
func TestWritesAreSyncedWithinSyncInterval(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{SyncInterval: 20 * time.Millisecond})
	fill(s, "a")
	st := s.Stats()
	require.Less(t, st.SyncedBytes, st.LogBytes, "not synced per write")
	require.Eventually(t, func() bool { st := s.Stats(); return st.SyncedBytes == st.LogBytes }, 5*time.Second, 5*time.Millisecond)
}

// TestCompactionKeepsLiveRecords: a log more than half dead is rewritten
// with its live records only, while writes go on; what it held loads the
// same.
func TestCompactionKeepsLiveRecords(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{SyncInterval: 5 * time.Millisecond, CompactBytes: 64 << 10})
	fill(s, "keep")
	big := make([]byte, 4<<10)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			id := string(rune('w' + w))
			s.SaveClient(engine.ClientRecord{ID: id, Protocol: 4, Expiry: 60})
			for i := range 400 {
				m := &engine.Message{Topic: "t", Payload: big, QoS: 1}
				s.SaveMessage(id, uint16(i%7+1), m, nil)
				s.SaveRetained(&engine.Message{Topic: id, Payload: []byte{byte(i)}})
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		st := s.Stats()
		return st.LogBytes < 2*(st.LiveBytes+headerSize)+1
	}, 10*time.Second, 5*time.Millisecond, "compacted")
	st := s.Stats()
	require.Less(t, st.LogBytes, int64(400<<10))
	msgs, err := s.LoadMessages("w")
	require.NoError(t, err)
	require.Len(t, msgs, 7)
	require.NoError(t, s.Close())

	s = openStore(t, dir)
	sessions, retained := load(t, s)
	require.Len(t, sessions, 5)
	wantFilled(t, sessions[0], "keep")
	for _, ss := range sessions[1:] {
		require.Len(t, ss.Messages, 7)
	}
	require.Len(t, retained, 4)
	for _, m := range retained {
		require.Equal(t, []byte{399 % 256}, m.Payload, "the last one set")
	}
	require.Equal(t, pick(st), pick(s.Stats()))
}
