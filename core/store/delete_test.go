package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// bodiesOf lists the bodies of every queue of topic.
func bodiesOf(t *testing.T, s *Store, topic string) []string {
	t.Helper()
	var out []string
	for _, m := range countAll(t, s, topic) {
		out = append(out, string(m.Body))
	}
	return out
}

// TestDeleteTopic: a deleted topic is gone — queues, messages by ID and by
// key, committed offsets — and one created under the same name starts
// empty; all of that holds after a clean restart and after a recovery that
// re-dispatches the whole log.
func TestDeleteTopic(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(dir, Options{DefaultQueues: 2})
	require.NoError(t, err)
	var old []core.SendResult
	for _, b := range []string{"a", "b", "c"} {
		r, err := s.Produce(ctx, &core.Message{Topic: "orders", ShardingKey: "car-1", Body: []byte(b)})
		require.NoError(t, err)
		old = append(old, r)
	}
	_, err = s.Produce(ctx, &core.Message{Topic: "other", ShardingKey: "car-1", Body: []byte("keep")})
	require.NoError(t, err)
	require.NoError(t, s.CommitOffset(ctx, "g", "orders", old[0].Queue, 2))

	require.NoError(t, s.DeleteTopic(ctx, "orders"))
	_, err = s.Topic(ctx, "orders")
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	_, err = s.Read(ctx, core.ReadRequest{Topic: "orders"})
	require.ErrorIs(t, err, core.ErrTopicNotFound)
	_, err = s.Get(ctx, old[0].ID)
	require.ErrorIs(t, err, core.ErrMessageNotFound)
	require.ErrorIs(t, s.DeleteTopic(ctx, "orders"), core.ErrTopicNotFound)
	require.ErrorIs(t, s.DeleteTopic(ctx, "%DLQ%g"), core.ErrInvalidTopic, "system topics stay")
	_, err = os.Stat(filepath.Join(dir, dirConsumeQueue, "orders"))
	require.True(t, errors.Is(err, os.ErrNotExist), "queue files removed")

	// A new incarnation with another queue count starts empty.
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "orders", Queues: 4})
	require.NoError(t, err)
	_, err = s.CommittedOffset(ctx, "g", "orders", old[0].Queue)
	require.ErrorIs(t, err, core.ErrNoCommittedOffset)
	fresh, err := s.Produce(ctx, &core.Message{Topic: "orders", ShardingKey: "car-1", Body: []byte("new")})
	require.NoError(t, err)
	require.EqualValues(t, 0, fresh.QueueOffset)
	check := func(s *Store) {
		t.Helper()
		require.Equal(t, []string{"new"}, bodiesOf(t, s, "orders"))
		found, err := s.FindByKey(ctx, "orders", "car-1", core.KeyQuery{})
		require.NoError(t, err)
		require.Len(t, found, 1, "the old incarnation is not found by key")
		require.Equal(t, "new", string(found[0].Body))
		_, err = s.Get(ctx, old[1].ID)
		require.ErrorIs(t, err, core.ErrMessageNotFound)
		got, err := s.Get(ctx, fresh.ID)
		require.NoError(t, err)
		require.Equal(t, "new", string(got.Body))
		require.Equal(t, []string{"keep"}, bodiesOf(t, s, "other"))
		info, err := s.Topic(ctx, "orders")
		require.NoError(t, err)
		require.Equal(t, 4, info.Queues)
	}
	check(s)
	require.NoError(t, s.Close())

	// Clean restart.
	s, err = Open(dir, Options{DefaultQueues: 2})
	require.NoError(t, err)
	check(s)
	require.NoError(t, s.Close())

	// A recovery that re-dispatches the whole log (checkpoint gone): the
	// deleted incarnation's records stay fenced off.
	require.NoError(t, os.Remove(filepath.Join(dir, fileCheckpoint)))
	markUnclean(t, dir)
	s, err = Open(dir, Options{DefaultQueues: 2})
	require.NoError(t, err)
	check(s)

	// Deleted and not recreated: it stays gone across a restart.
	require.NoError(t, s.DeleteTopic(ctx, "other"))
	require.NoError(t, s.Close())
	s, err = Open(dir, Options{DefaultQueues: 2})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Topic(ctx, "other")
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// A produce racing the deletion fails with ErrTopicNotFound or lands in the
// new incarnation; never in the deleted one.
func TestDeleteTopicRacingProduces(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{DefaultQueues: 2, DisableAutoCreate: true})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.CreateTopic(ctx, core.TopicConfig{Name: "t"})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			_, err := s.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x")})
			if err != nil {
				done <- err
				return
			}
		}
	}()
	for {
		info, err := s.Topic(ctx, "t")
		require.NoError(t, err)
		if info.Ranges[0].Max+info.Ranges[1].Max > 100 {
			break
		}
	}
	require.NoError(t, s.DeleteTopic(ctx, "t"))
	require.ErrorIs(t, <-done, core.ErrTopicNotFound)
	_, err = s.Topic(ctx, "t")
	require.ErrorIs(t, err, core.ErrTopicNotFound)
}

// Reads racing the deletion succeed or answer ErrTopicNotFound, nothing
// else.
func TestDeleteTopicRacingReads(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{DefaultQueues: 1})
	require.NoError(t, err)
	defer s.Close()
	for i := 0; i < 200; i++ {
		_, err := s.Produce(ctx, &core.Message{Topic: "t", Body: []byte("x")})
		require.NoError(t, err)
	}
	errs := make(chan error, 1)
	go func() {
		for {
			_, err := s.Read(ctx, core.ReadRequest{Topic: "t", Offset: 0, MaxCount: 200})
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	require.NoError(t, s.DeleteTopic(ctx, "t"))
	require.ErrorIs(t, <-errs, core.ErrTopicNotFound)
}
