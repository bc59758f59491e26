package admin

import (
	"net/http"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/retry"
)

// groupInfo describes a group with live members.
type groupInfo struct {
	Name    string       `json:"name"`
	Mode    group.Mode   `json:"mode"`
	Members []memberInfo `json:"members"`
	// Lag and TotalLag are in GET /api/v1/groups/{group} only.
	Lag      []queueLag `json:"lag,omitempty"`
	TotalLag *int64     `json:"total_lag,omitempty"`
}

type memberInfo struct {
	ClientID      string         `json:"client_id"`
	JoinedAt      time.Time      `json:"joined_at"`
	LastHeartbeat time.Time      `json:"last_heartbeat"`
	Subscriptions []subscription `json:"subscriptions"`
	Queues        []queueRef     `json:"queues"`
}

type subscription struct {
	Topic string   `json:"topic"`
	Tags  []string `json:"tags,omitempty"`
}

type queueRef struct {
	Topic string `json:"topic"`
	Queue int    `json:"queue"`
}

// queueLag is a group's progress on one queue.
type queueLag struct {
	Topic string `json:"topic"`
	Queue int    `json:"queue"`
	// Member is whose offsets these are, in a broadcast group.
	Member string `json:"member,omitempty"`
	// Committed is the committed offset, -1 when the group never committed.
	Committed    int64     `json:"committed"`
	Min          int64     `json:"min"`
	Max          int64     `json:"max"`
	Lag          int64     `json:"lag"`
	LastConsumed time.Time `json:"last_consumed,omitzero"`
	// Owner is the member holding the queue's lease (clustering).
	Owner string `json:"owner,omitempty"`
}

func toGroup(g group.GroupInfo) groupInfo {
	out := groupInfo{Name: g.Name, Mode: g.Mode, Members: make([]memberInfo, 0, len(g.Members))}
	for _, m := range g.Members {
		mi := memberInfo{ClientID: m.ClientID, JoinedAt: m.JoinedAt.UTC(), LastHeartbeat: m.LastHeartbeat.UTC(),
			Subscriptions: make([]subscription, 0, len(m.Subscriptions)), Queues: make([]queueRef, 0, len(m.Queues))}
		for _, s := range m.Subscriptions {
			mi.Subscriptions = append(mi.Subscriptions, subscription{Topic: s.Topic, Tags: s.Tags})
		}
		for _, q := range m.Queues {
			mi.Queues = append(mi.Queues, queueRef{Topic: q.Topic, Queue: q.Queue})
		}
		out.Members = append(out.Members, mi)
	}
	return out
}

func (a *api) groups() (*group.Coordinator, error) {
	if a.opts.Groups == nil {
		return nil, disabled(CodeGroupsDisabled, "consumer groups")
	}
	return a.opts.Groups, nil
}

// pathGroupName returns the {group} of the path, a valid group name.
func pathGroupName(r *http.Request) (string, error) {
	name := r.PathValue("group")
	return name, retry.ValidateGroup(name)
}

// groupPage is one page of GET /api/v1/groups.
type groupPage struct {
	Groups []groupInfo `json:"groups"`
	Next   string      `json:"next,omitempty"`
}

// listGroups serves GET /api/v1/groups?max=&cursor=: the groups with live
// members (the coordinator knows no others).
func (a *api) listGroups(w http.ResponseWriter, r *http.Request) error {
	c, err := a.groups()
	if err != nil {
		return err
	}
	q, err := queryParams(r, "max", "cursor")
	if err != nil {
		return err
	}
	n, cursor, err := a.pageParams(q)
	if err != nil {
		return err
	}
	got, next := pageOf(c.Groups(), func(g group.GroupInfo) string { return g.Name }, n, cursor) // sorted by name
	page := groupPage{Groups: make([]groupInfo, 0, len(got)), Next: next}
	for _, g := range got {
		page.Groups = append(page.Groups, toGroup(g))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// getGroup serves GET /api/v1/groups/{group}: members and lag per queue
// (per member and queue in a broadcast group).
func (a *api) getGroup(w http.ResponseWriter, r *http.Request) error {
	c, err := a.groups()
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	name, err := pathGroupName(r)
	if err != nil {
		return err
	}
	var gi *group.GroupInfo
	for _, g := range c.Groups() {
		if g.Name == name {
			gi = &g
			break
		}
	}
	if gi == nil {
		return httperr.New(http.StatusNotFound, CodeGroupNotFound, "group %s has no live members", name)
	}
	out := toGroup(*gi)
	members := []string{""}
	if gi.Mode == group.Broadcast {
		members = members[:0]
		for _, m := range gi.Members {
			members = append(members, m.ClientID)
		}
	}
	out.Lag = []queueLag{}
	var total int64
	for _, m := range members {
		lags, err := c.Lag(r.Context(), name, m)
		if err != nil {
			return err
		}
		for _, l := range lags {
			ql := queueLag{Topic: l.Queue.Topic, Queue: l.Queue.Queue, Member: m, Committed: l.Committed,
				Min: l.Range.Min, Max: l.Range.Max, Lag: l.Lag, Owner: l.Owner}
			if !l.LastConsumed.IsZero() {
				ql.LastConsumed = l.LastConsumed.UTC()
			}
			out.Lag = append(out.Lag, ql)
			total += l.Lag
		}
	}
	out.TotalLag = &total
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}

// resetRequest is the body of POST /api/v1/groups/{group}/reset.
type resetRequest struct {
	Topic string `json:"topic"`
	// To is "earliest", "latest" (skip the backlog) or an RFC 3339 time.
	To string `json:"to"`
}

type resetResult struct {
	Group   string        `json:"group"`
	Topic   string        `json:"topic"`
	To      string        `json:"to"`
	Offsets []queueOffset `json:"offsets"`
}

type queueOffset struct {
	Queue  int   `json:"queue"`
	Offset int64 `json:"offset"`
}

// resetGroup serves POST /api/v1/groups/{group}/reset.
func (a *api) resetGroup(w http.ResponseWriter, r *http.Request) error {
	c, err := a.groups()
	if err != nil {
		return err
	}
	name, err := pathGroupName(r)
	if err != nil {
		return err
	}
	var req resetRequest
	if err := a.decodeBody(w, r, &req, false); err != nil {
		return err
	}
	if req.Topic == "" {
		return httperr.BadRequest("topic missing")
	}
	if isSystem(req.Topic) {
		err = core.ValidateSystemTopic(req.Topic) // the group's retry topic
	} else {
		err = core.ValidateTopic(req.Topic)
	}
	if err != nil {
		return err
	}
	var to group.ResetTarget
	switch req.To {
	case "earliest":
	case "latest":
		to.Latest = true
	case "":
		return httperr.BadRequest(`to missing: want "earliest", "latest" or an RFC 3339 time`)
	default:
		t, err := time.Parse(time.RFC3339, req.To)
		if err != nil {
			return httperr.BadRequest(`to: want "earliest", "latest" or an RFC 3339 time such as 2030-01-02T15:04:05Z`)
		}
		to.Time = t
	}
	offs, err := c.ResetOffsets(r.Context(), name, req.Topic, to)
	if err != nil {
		return err
	}
	out := resetResult{Group: name, Topic: req.Topic, To: req.To, Offsets: make([]queueOffset, len(offs))}
	for q, off := range offs {
		out.Offsets[q] = queueOffset{Queue: q, Offset: off}
	}
	a.audit(r).Str(fieldGroup, name).Str(fieldTopic, req.Topic).Str("to", req.To).Msg("group offsets reset")
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}
