package session

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// Power cuts, on a filesystem that keeps only what was synced (memFS).

const testDir = "/data/sessions"

// slow is a store whose sync loop never runs on its own: the tests sync
// when they mean to.
var slow = Options{SyncInterval: time.Hour, CompactBytes: 1 << 40}

func openMem(t testing.TB, fs *memFS) *Store {
	t.Helper()
	s, err := openLog(testDir, slow, fs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func loadAll(t testing.TB, s *Store) ([]engine.StoredSession, []*engine.Message) {
	t.Helper()
	sessions, retained, err := s.b.load()
	require.NoError(t, err)
	for i := range sessions {
		sessions[i].Offline = time.Time{} // Load writes the offline time of sessions that died online: not compared
	}
	return sessions, retained
}

// TestPowerLossKeepsWhatWasSynced: after a power cut the log holds what the
// last fsync covered, plus any prefix of what followed; it opens, and
// loads at least what was synced, at every cut.
func TestPowerLossKeepsWhatWasSynced(t *testing.T) {
	fs := newMemFS()
	s := openMem(t, fs)
	fill(s, "synced")
	s.lg.sync()
	s.mu.Lock()
	syncedAt := s.lg.size
	s.mu.Unlock()
	fill(s, "later")
	s.mu.Lock()
	end := s.lg.size
	s.mu.Unlock()
	image := cloneFS(fs)
	for keep := 0; keep <= int(end-syncedAt); keep += 7 {
		cut := cloneFS(image)
		cut.crash(keep)
		s2, err := openLog(testDir, slow, cut)
		require.NoError(t, err, "keep %d", keep)
		sessions, _, err := s2.b.load()
		require.NoError(t, err)
		found := false
		for _, st := range sessions {
			if st.Client.ID == "synced" {
				wantFilled(t, st, "synced")
				found = true
			}
		}
		require.True(t, found, "keep %d: what was synced loads", keep)
		require.NoError(t, s2.Close())
	}
	// Close syncs: nothing is lost.
	require.NoError(t, s.Close())
	fs.crash(0)
	s3 := openMem(t, fs)
	sessions, _ := loadAll(t, s3)
	require.Len(t, sessions, 2)
}

func cloneFS(m *memFS) *memFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := newMemFS()
	files := map[*memFile]*memFile{}
	dup := func(f *memFile) *memFile {
		if g, ok := files[f]; ok {
			return g
		}
		g := &memFile{data: append([]byte(nil), f.data...), synced: append([]byte(nil), f.synced...)}
		files[f] = g
		return g
	}
	for k, v := range m.names {
		c.names[k] = dup(v)
	}
	for k, v := range m.durable {
		c.durable[k] = dup(v)
	}
	return c
}

// TestCompactionSurvivesACrashAtEveryStep: a power cut at any point of a
// compaction — every write, sync, rename and folder sync of it — leaves a
// log that loads what the store held.
func TestCompactionSurvivesACrashAtEveryStep(t *testing.T) {
	fs := newMemFS()
	s := openMem(t, fs)
	fill(s, "a")
	s.SaveClient(engine.ClientRecord{ID: "b", Protocol: 4, Expiry: 60})
	for i := range 50 {
		s.SaveSubscription("b", "churn", topictree.Options{QoS: byte(i % 3)})
		s.SaveRetained(&engine.Message{Topic: "r", Payload: []byte{byte(i)}})
	}
	s.lg.sync()
	want, wantRet := loadAll(t, s)
	require.NoError(t, s.Close())
	image := cloneFS(fs)

	// How many mutating calls a whole compaction makes.
	probe := cloneFS(image)
	sp := openMem(t, probe)
	before := probe.ops
	require.NoError(t, sp.lg.compact())
	steps := probe.ops - before
	require.Greater(t, steps, 3)
	require.NoError(t, sp.Close())

	for k := 0; k <= steps; k++ {
		fs := cloneFS(image)
		s := openMem(t, fs)
		fs.mu.Lock()
		fs.fail = fs.ops + k
		fs.mu.Unlock()
		err := s.lg.compact()
		if k < steps {
			require.Error(t, err, "step %d", k)
		}
		fs.crash(0)
		s2, err := openLog(testDir, slow, fs)
		require.NoError(t, err, "crash at step %d", k)
		got, gotRet := loadAll(t, s2)
		require.Equal(t, want, got, "crash at step %d", k)
		require.Equal(t, wantRet, gotRet, "crash at step %d", k)
		require.NoError(t, s2.Close())
		_ = s.Close()
	}
}

// TestWriteErrorIsSticky: after a failed write the store writes nothing
// more (no hole in the file), says so, and what was written before loads.
func TestWriteErrorIsSticky(t *testing.T) {
	fs := newMemFS()
	s := openMem(t, fs)
	fill(s, "a")
	fs.mu.Lock()
	fs.fail = fs.ops
	fs.mu.Unlock()
	s.SaveSubscription("a", "lost", topictree.Options{QoS: 1})
	fs.mu.Lock()
	fs.fail = -1
	fs.mu.Unlock()
	s.SaveSubscription("a", "refused", topictree.Options{QoS: 1})
	st := s.Stats()
	require.ErrorIs(t, st.Failed, ErrLogFailed)
	require.Equal(t, int64(2), st.WriteErrors[reasonIO])
	err := s.Close()
	require.True(t, err == nil || errors.Is(err, ErrLogFailed))

	s2 := openMem(t, fs)
	sessions, _ := loadAll(t, s2)
	require.Len(t, sessions, 1)
	require.Len(t, sessions[0].Subscriptions, 2, "neither later subscription was written")
}

// TestSyncInboundSurvivesPowerLoss: with Options.SyncInbound, the record of
// an inbound QoS 2 publish is fsynced by SyncInbound — what the engine
// waits for before the publish goes to the core — and a power cut right
// after keeps it; without, SyncInbound does not fsync and the cut loses
// it (the record is durable against a process crash only).
func TestSyncInboundSurvivesPowerLoss(t *testing.T) {
	for _, durable := range []bool{false, true} {
		fs := newMemFS()
		o := slow
		o.SyncInbound = durable
		s, err := openLog(testDir, o, fs)
		require.NoError(t, err)
		s.SaveClient(engine.ClientRecord{ID: "car", Protocol: 5, Expiry: 300})
		s.lg.sync() // the session itself is on disk
		s.SaveInbound("car", 7, 1_800_000_000_000_000_007, true)
		require.NoError(t, s.SyncInbound(t.Context(), "car"))
		fs.crash(0)
		require.NoError(t, s.Close())

		s2, err := openLog(testDir, slow, fs)
		require.NoError(t, err)
		sessions, _, err := s2.b.load()
		require.NoError(t, err)
		require.Len(t, sessions, 1)
		kept := slices.ContainsFunc(sessions[0].Inbound, func(in engine.StoredInbound) bool {
			return in.PID == 7 && in.QoS2ID == 1_800_000_000_000_000_007
		})
		require.Equal(t, durable, kept, "SyncInbound %v: the record after a power cut", durable)
		require.NoError(t, s2.Close())
	}
}
