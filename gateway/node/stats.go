package node

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
)

// Bounds of the /stats sections statsExtra builds: the dashboard polls
// every second, so each answer stays small.
const (
	maxStatsTopics = 50
	maxStatsGroups = 50
)

// TopicStats is one row of /stats "topics".
type TopicStats struct {
	Name   string `json:"name"`
	Queues int    `json:"queues"`
	// Messages is the sum of the queues' max offsets: every message ever
	// stored in the topic (retention does not lower it), so its growth
	// between two polls is the topic's rate.
	Messages int64 `json:"messages"`
}

// GroupStats is one row of /stats "groups": a group's progress on one
// topic, summed over the topic's queues. Broadcast groups keep progress
// per member: one row per member then.
type GroupStats struct {
	Group   string `json:"group"`
	Mode    string `json:"mode"`
	Topic   string `json:"topic"`
	Member  string `json:"member,omitempty"` // broadcast: whose progress
	Members int    `json:"members"`
	Queues  int    `json:"queues"`
	Lag     int64  `json:"lag"`
	// LastConsumed is the latest commit on any of the queues; absent if
	// none since the coordinator started.
	LastConsumed *time.Time `json:"last_consumed,omitempty"`
	// Owners are the members holding the queues' leases (clustering).
	Owners []string `json:"owners,omitempty"`
}

// statsExtra returns the /stats sections the dashboard needs and metrics
// lack: "topics" (the maxStatsTopics with the most messages, with
// "topics_total") and "groups" (the maxStatsGroups rows with the most lag,
// with "groups_total"). A section that could not be read is left out and
// named in "unavailable". g may be nil (no groups section).
func statsExtra(b core.Broker, g *group.Coordinator) func(ctx context.Context) map[string]any {
	return func(ctx context.Context) map[string]any {
		out := map[string]any{}
		var unavailable []string
		if topics, n, err := topicRows(ctx, b); err == nil {
			out["topics"], out["topics_total"] = topics, n
		} else {
			unavailable = append(unavailable, "topics")
		}
		if g != nil {
			if groups, n, err := groupRows(ctx, g); err == nil {
				out["groups"], out["groups_total"] = groups, n
			} else {
				unavailable = append(unavailable, "groups")
			}
		}
		if unavailable != nil {
			out["unavailable"] = unavailable
		}
		return out
	}
}

func topicRows(ctx context.Context, b core.Broker) ([]TopicStats, int, error) {
	infos, err := b.Topics(ctx)
	if err != nil {
		return nil, 0, err
	}
	rows := make([]TopicStats, 0, len(infos))
	for _, t := range infos {
		r := TopicStats{Name: t.Name, Queues: t.Queues}
		for _, q := range t.Ranges {
			r.Messages += q.Max
		}
		rows = append(rows, r)
	}
	slices.SortStableFunc(rows, func(a, b TopicStats) int { return cmp.Compare(b.Messages, a.Messages) }) // by name within
	return rows[:min(len(rows), maxStatsTopics)], len(rows), nil
}

func groupRows(ctx context.Context, g *group.Coordinator) ([]GroupStats, int, error) {
	rows, err := allGroupRows(ctx, g)
	if err != nil {
		return nil, 0, err
	}
	slices.SortStableFunc(rows, func(a, b GroupStats) int { return cmp.Compare(b.Lag, a.Lag) })
	return rows[:min(len(rows), maxStatsGroups)], len(rows), nil
}

// topLag is up to n of rows, those with the most lag first.
func topLag(rows map[string]GroupStats, n int) []GroupStats {
	out := make([]GroupStats, 0, len(rows))
	for _, r := range rows {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b GroupStats) int {
		return cmp.Or(cmp.Compare(b.Lag, a.Lag), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Member, b.Member))
	})
	return out[:min(len(out), n)]
}

// allGroupRows is every group's progress per topic (broadcast: per
// member), in the coordinator's order.
func allGroupRows(ctx context.Context, g *group.Coordinator) ([]GroupStats, error) {
	rows := []GroupStats{}
	for _, gi := range g.Groups() {
		members := []string{""} // the group's own offsets
		if gi.Mode == group.Broadcast {
			members = members[:0]
			for _, m := range gi.Members {
				members = append(members, m.ClientID)
			}
		}
		for _, member := range members {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			lags, err := g.Lag(ctx, gi.Name, member)
			if err != nil {
				continue // the group lost its last member since Groups
			}
			rows = append(rows, sumLags(gi, member, lags)...)
		}
	}
	return rows, nil
}

// sumLags folds a group's per-queue lags (sorted by topic) into one row
// per topic.
func sumLags(gi group.GroupInfo, member string, lags []group.QueueLag) []GroupStats {
	var rows []GroupStats
	for _, l := range lags {
		if len(rows) == 0 || rows[len(rows)-1].Topic != l.Queue.Topic {
			rows = append(rows, GroupStats{Group: gi.Name, Mode: string(gi.Mode), Topic: l.Queue.Topic, Member: member, Members: len(gi.Members)})
		}
		r := &rows[len(rows)-1]
		r.Queues++
		r.Lag += l.Lag
		if !l.LastConsumed.IsZero() && (r.LastConsumed == nil || l.LastConsumed.After(*r.LastConsumed)) {
			t := l.LastConsumed.UTC()
			r.LastConsumed = &t
		}
		if l.Owner != "" && !slices.Contains(r.Owners, l.Owner) {
			r.Owners = append(r.Owners, l.Owner)
		}
	}
	for i := range rows {
		slices.Sort(rows[i].Owners)
	}
	return rows
}
