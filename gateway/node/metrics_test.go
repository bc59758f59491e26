package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/core/txn"
)

func TestCoreCollector(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	ds, err := delay.New(st, filepath.Join(dir, "delay"), delay.Options{})
	require.NoError(t, err)
	defer ds.Close()
	ts, err := txn.New(ds.Broker(), txn.Options{})
	require.NoError(t, err)
	require.NoError(t, ts.Start(context.Background()))
	defer ts.Close()

	_, err = ds.Broker().Produce(t.Context(), &core.Message{Topic: "t", DeliverAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	half, err := ts.SendHalf(t.Context(), "g", &core.Message{Topic: "t"})
	require.NoError(t, err)
	_, err = ts.SendHalf(t.Context(), "g", &core.Message{Topic: "t"})
	require.NoError(t, err)
	_, err = ts.End(t.Context(), half.ID, "g", txn.Rollback, false)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	reg.MustRegister(newCoreCollector(ds, ts, nil))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			if c := m.GetCounter(); c != nil {
				got[name] = c.GetValue()
			} else {
				got[name] = m.GetGauge().GetValue()
			}
		}
	}
	require.Equal(t, 1.0, got["ferrymq_delay_scheduled_total"])
	require.Equal(t, 1.0, got["ferrymq_delay_waiting/12"], "an hour waits in the 2048 s level")
	require.Equal(t, 1.0, got["ferrymq_txn_pending"])
	require.Equal(t, 1.0, got["ferrymq_txn_resolved_total/rolled_back"])
	require.Equal(t, 0.0, got["ferrymq_txn_resolved_total/committed"])
}
