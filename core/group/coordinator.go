package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/gate"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Mode is how a group's members share its messages.
type Mode string

const (
	// Clustering spreads queues over members; each message goes to one.
	Clustering Mode = "clustering"
	// Broadcast gives every member every message, each with its own progress.
	Broadcast Mode = "broadcast"
)

// ConsumeFrom says where a group starts on a queue it never committed.
type ConsumeFrom string

const (
	// FromEarliest starts at the oldest retained message (the default: a
	// new group misses nothing that is still stored).
	FromEarliest ConsumeFrom = "earliest"
	// FromLatest starts at the end: only messages stored from now on.
	FromLatest ConsumeFrom = "latest"
	// FromTimestamp starts at the first message stored at or after the
	// request's FromTime (RocketMQ's CONSUME_FROM_TIMESTAMP): a member that
	// joins a little after it began listening misses nothing in between.
	FromTimestamp ConsumeFrom = "timestamp"
)

// Subscription is one topic a member consumes, optionally filtered by tags.
type Subscription struct {
	Topic string
	// Tags, when non-empty, keeps only messages with one of these tags.
	Tags []string
}

// QueueRef names one queue of one topic.
type QueueRef struct {
	Topic string
	Queue int
}

func (q QueueRef) String() string { return fmt.Sprintf("%s/%d", q.Topic, q.Queue) }

// RetryTopic is the topic a group's failed messages come back on; every
// clustering member subscribes to it implicitly.
func RetryTopic(group string) string { return retry.RetryTopic(group) }

// Options configure a Coordinator. A zero field means its default.
type Options struct {
	// HeartbeatTimeout is how long a member may stay silent before it is
	// considered gone and its leases expire; default 3 s (three missed
	// heartbeats at the default 1 s interval).
	HeartbeatTimeout time.Duration
	// ReleaseGrace is how long a member may keep the lease of a queue that
	// a rebalance took from it, to finish what it is processing; default
	// HeartbeatTimeout.
	ReleaseGrace time.Duration
	// CheckInterval is how often silent members and stale leases are
	// expired and topics re-checked for new queues; default
	// HeartbeatTimeout / 6.
	CheckInterval time.Duration
	// LeaseLogSize bounds the in-memory log of lease events; default 65,536.
	LeaseLogSize int
	// Trace, when set, records the hops of traced messages (those whose
	// topic, or original topic for a retried message, Trace.Enabled
	// reports): "delivered" when Pull returns one, "committed" when a
	// commit passes it. Delivered messages are remembered until then, at
	// most 4,096 per queue (the oldest are forgotten). Nil records nothing.
	Trace  *trace.Recorder
	Logger *zerolog.Logger
	Now    func() time.Time
}

func (o Options) withDefaults() Options {
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = 3 * time.Second
	}
	if o.ReleaseGrace == 0 {
		o.ReleaseGrace = o.HeartbeatTimeout
	}
	if o.CheckInterval == 0 {
		o.CheckInterval = o.HeartbeatTimeout / 6
	}
	if o.LeaseLogSize == 0 {
		o.LeaseLogSize = 1 << 16
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.HeartbeatTimeout < 0 || o.ReleaseGrace < 0 || o.CheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat timeout, release grace and check interval must be positive"))
	}
	if o.LeaseLogSize < 0 {
		errs = append(errs, fmt.Errorf("lease log size %d: negative", o.LeaseLogSize))
	}
	if len(errs) > 0 {
		return fmt.Errorf("group: invalid options: %w", errors.Join(errs...))
	}
	return nil
}

// Coordinator runs the consumer groups of one engine.
type Coordinator struct {
	b    core.Broker
	opts Options
	log  zerolog.Logger
	gate *gate.Gate // epoch barriers of resized topics

	mu     sync.Mutex // guards groups and the lease log
	groups map[string]*groupState
	events []LeaseEvent // ring buffer
	evNext int
	evFull bool
	closed bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type groupState struct {
	name    string
	mode    Mode
	members map[string]*member
	version uint64
	assign  map[string][]QueueRef // clustering: member → queues
	leases  map[QueueRef]*lease
	// resetGen counts ResetOffsets per queue; a member whose last pull saw
	// an older generation is told to drop its position.
	resetGen   map[QueueRef]uint64
	lastCommit map[QueueRef]time.Time
	// traced holds the traced messages delivered and not yet committed;
	// nil until tracing delivers one.
	traced map[tracedKey]*tracedQueue
}

type member struct {
	id   string
	subs []Subscription
	// from and fromTime are where this member starts a queue its group
	// never committed (its last heartbeat's): each member's own, so a
	// broadcast member that joins later does not move an earlier one's
	// FromTimestamp start.
	from      ConsumeFrom
	fromTime  time.Time
	lastSeen  time.Time
	joinedAt  time.Time
	resetSeen map[QueueRef]uint64
}

type lease struct {
	owner     string
	expires   time.Time
	revokedAt time.Time // when a rebalance took the queue away; zero while assigned
}

// New returns a Coordinator over b. Call Start, and Close when done.
func New(b core.Broker, opts Options) (*Coordinator, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Coordinator{
		b:      b,
		gate:   gate.New(b),
		opts:   opts,
		log:    opts.Logger.With().Str("component", "group").Logger(),
		groups: map[string]*groupState{},
		events: make([]LeaseEvent, opts.LeaseLogSize),
	}, nil
}

// Start runs the goroutine that expires silent members and stale leases.
func (c *Coordinator) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(c.opts.CheckInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				c.check(ctx)
			case <-ctx.Done():
				return
			}
		}
	}()
}

// Drop forgets group here — its members, their assignment and queue
// leases, what its barriers were seen to allow — as a node does when
// another node takes the group over: the members' next requests go there
// (the cluster's placement), and should the group come back it starts
// afresh from its committed offsets, which stay in the broker. Broadcast
// members' own offset keys (group@member) go with it.
func (c *Coordinator) Drop(group string) {
	c.mu.Lock()
	g := c.groups[group]
	delete(c.groups, group)
	c.mu.Unlock()
	if g == nil {
		return
	}
	c.gate.Forget(group, "")
	for id := range g.members {
		c.gate.Forget(group+"@"+id, "")
	}
	c.log.Info().Str("group", group).Msg("group dropped: served by another node now")
}

// Close stops the coordinator and waits for its goroutine.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	return nil
}

// validateID checks a group or client ID by the same rule as group names
// everywhere (retry.ValidateGroup): 1–100 of [A-Za-z0-9._-].
func validateID(kind, id string) error {
	if err := retry.ValidateGroup(id); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidGroup, kind, err)
	}
	return nil
}

// HeartbeatRequest registers a member or keeps it alive.
type HeartbeatRequest struct {
	Group, ClientID string
	// Mode defaults to Clustering. All members of a group share one mode.
	Mode Mode
	// From applies to queues the group never committed; default FromEarliest.
	From ConsumeFrom
	// FromTime is where FromTimestamp starts (required with it, else
	// ignored).
	FromTime      time.Time
	Subscriptions []Subscription
}

// Assignment is what a member should consume now.
type Assignment struct {
	// Version changes whenever the group's assignment changes.
	Version uint64
	Queues  []QueueRef
}

// Heartbeat registers the member, renews its leases, rebalances if its
// subscriptions changed, and returns its assignment.
func (c *Coordinator) Heartbeat(ctx context.Context, req HeartbeatRequest) (Assignment, error) {
	if err := validateID("group", req.Group); err != nil {
		return Assignment{}, err
	}
	if err := validateID("client id", req.ClientID); err != nil {
		return Assignment{}, err
	}
	if req.Mode == "" {
		req.Mode = Clustering
	}
	if req.Mode != Clustering && req.Mode != Broadcast {
		return Assignment{}, fmt.Errorf("%w: unknown mode %q", ErrModeMismatch, req.Mode)
	}
	if req.From == "" {
		req.From = FromEarliest
	}
	switch req.From {
	case FromEarliest, FromLatest:
		req.FromTime = time.Time{}
	case FromTimestamp:
		if req.FromTime.IsZero() {
			return Assignment{}, fmt.Errorf("%w: start position %q without a time", ErrInvalidGroup, req.From)
		}
	default:
		return Assignment{}, fmt.Errorf("%w: unknown start position %q", ErrInvalidGroup, req.From)
	}
	subs, err := normalizeSubs(req.Subscriptions)
	if err != nil {
		return Assignment{}, err
	}
	// Topic sizes are read outside the lock.
	sizes := c.topicSizes(ctx, subs, req.Group)

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Assignment{}, ErrClosed
	}
	now := c.opts.Now()
	g := c.groups[req.Group]
	if g == nil {
		g = &groupState{name: req.Group, mode: req.Mode, members: map[string]*member{},
			assign: map[string][]QueueRef{}, leases: map[QueueRef]*lease{}, resetGen: map[QueueRef]uint64{},
			lastCommit: map[QueueRef]time.Time{}}
		c.groups[req.Group] = g
	}
	if len(g.members) > 0 && g.mode != req.Mode {
		return Assignment{}, fmt.Errorf("%w: group %s is %s, member %s asked for %s", ErrModeMismatch, g.name, g.mode, req.ClientID, req.Mode)
	}
	g.mode = req.Mode
	m := g.members[req.ClientID]
	changed := false
	if m == nil {
		m = &member{id: req.ClientID, joinedAt: now, resetSeen: map[QueueRef]uint64{}}
		for ref, gen := range g.resetGen {
			m.resetSeen[ref] = gen // a new member starts from committed offsets anyway
		}
		g.members[req.ClientID] = m
		changed = true
		c.log.Info().Str("group", g.name).Str("client", m.id).Str("mode", string(g.mode)).Msg("member joined")
	} else if !slices.EqualFunc(m.subs, subs, subEqual) {
		changed = true
		c.log.Info().Str("group", g.name).Str("client", m.id).Msg("member changed its subscriptions")
	}
	m.subs = subs
	m.from, m.fromTime = req.From, req.FromTime
	m.lastSeen = now
	for _, l := range g.leases {
		if l.owner == m.id && (l.revokedAt.IsZero() || now.Sub(l.revokedAt) < c.opts.ReleaseGrace) {
			l.expires = now.Add(c.opts.HeartbeatTimeout)
		}
	}
	c.rebalanceLocked(g, sizes, changed)
	return Assignment{Version: g.version, Queues: slices.Clone(g.assign[m.id])}, nil
}

func subEqual(a, b Subscription) bool { return a.Topic == b.Topic && slices.Equal(a.Tags, b.Tags) }

func normalizeSubs(in []Subscription) ([]Subscription, error) {
	out := make([]Subscription, 0, len(in))
	seen := map[string]bool{}
	for _, s := range in {
		if err := core.ValidateTopic(s.Topic); err != nil {
			return nil, err
		}
		if seen[s.Topic] {
			return nil, fmt.Errorf("%w: topic %s subscribed twice", ErrInvalidGroup, s.Topic)
		}
		seen[s.Topic] = true
		tags := slices.Clone(s.Tags)
		sort.Strings(tags)
		out = append(out, Subscription{Topic: s.Topic, Tags: tags})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out, nil
}

// topicSizes returns the queue count of each subscribed topic and of the
// group's retry topic (0 for a topic that does not exist yet).
func (c *Coordinator) topicSizes(ctx context.Context, subs []Subscription, group string) map[string]int {
	sizes := map[string]int{}
	for _, s := range subs {
		sizes[s.Topic] = c.queueCount(ctx, s.Topic)
	}
	rt := RetryTopic(group)
	sizes[rt] = c.queueCount(ctx, rt)
	return sizes
}

func (c *Coordinator) queueCount(ctx context.Context, topic string) int {
	info, err := c.b.Topic(ctx, topic)
	if err != nil {
		return 0
	}
	return len(info.Ranges) // the retired queues of a resized topic too, until drained
}

// rebalanceLocked recomputes the group's assignment from its members and
// topic sizes; force bumps the version even if nothing moved.
func (c *Coordinator) rebalanceLocked(g *groupState, sizes map[string]int, force bool) {
	next := map[string][]QueueRef{}
	// Which members take part in each topic.
	byTopic := map[string][]string{}
	for id, m := range g.members {
		for _, s := range m.subs {
			byTopic[s.Topic] = append(byTopic[s.Topic], id)
		}
		if g.mode == Clustering {
			rt := RetryTopic(g.name)
			byTopic[rt] = append(byTopic[rt], id)
		}
	}
	for topic, ids := range byTopic {
		n, ok := sizes[topic]
		if !ok {
			n = c.queueCount(context.Background(), topic)
		}
		sort.Strings(ids)
		for i, id := range ids {
			lo, hi := 0, n
			if g.mode == Clustering {
				lo, hi = allocate(n, len(ids), i)
			}
			for q := lo; q < hi; q++ {
				next[id] = append(next[id], QueueRef{Topic: topic, Queue: q})
			}
		}
	}
	for id := range next {
		sort.Slice(next[id], func(a, b int) bool {
			x, y := next[id][a], next[id][b]
			if x.Topic != y.Topic {
				return x.Topic < y.Topic
			}
			return x.Queue < y.Queue
		})
	}
	same := len(next) == len(g.assign)
	for id, qs := range next {
		if !slices.Equal(qs, g.assign[id]) {
			same = false
		}
	}
	if same && !force {
		return
	}
	g.assign = next
	g.version++
	if g.mode != Clustering {
		return
	}
	now := c.opts.Now()
	for ref, l := range g.leases {
		if slices.Contains(next[l.owner], ref) {
			l.revokedAt = time.Time{}
		} else if l.revokedAt.IsZero() {
			l.revokedAt = now
		}
	}
	if !same {
		c.log.Info().Str("group", g.name).Uint64("version", g.version).Int("members", len(g.members)).Msg("group rebalanced")
	}
}

// allocate is RocketMQ's average allocation: queues [lo, hi) of n for member
// i of m (members sorted by client ID). The first n mod m members get one
// extra queue.
func allocate(n, m, i int) (lo, hi int) {
	if m == 0 || n == 0 || i >= n {
		return 0, 0
	}
	size := n / m
	if i < n%m {
		size++
		lo = i * size
	} else {
		lo = i*size + n%m
	}
	return lo, min(lo+size, n)
}

// check expires silent members and leases a rebalance took away whose
// holders did not release them in time, and picks up topics that grew.
func (c *Coordinator) check(ctx context.Context) {
	c.mu.Lock()
	type want struct {
		g     *groupState
		subs  []Subscription
		group string
	}
	var groups []want
	for _, g := range c.groups {
		var subs []Subscription
		for _, m := range g.members {
			subs = append(subs, m.subs...)
		}
		groups = append(groups, want{g: g, subs: subs, group: g.name})
	}
	c.mu.Unlock()

	sizes := make([]map[string]int, len(groups))
	for i, w := range groups {
		sizes[i] = c.topicSizes(ctx, w.subs, w.group)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	for i, w := range groups {
		g := w.g
		gone := false
		for id, m := range g.members {
			if now.Sub(m.lastSeen) >= c.opts.HeartbeatTimeout {
				delete(g.members, id)
				g.forgetMemberLocked(id)
				gone = true
				c.log.Warn().Str("group", g.name).Str("client", id).Dur("silent", now.Sub(m.lastSeen)).Msg("member expired: missed heartbeats")
			}
		}
		for ref, l := range g.leases {
			expired := !now.Before(l.expires)
			stale := !l.revokedAt.IsZero() && now.Sub(l.revokedAt) >= c.opts.ReleaseGrace
			if _, alive := g.members[l.owner]; !alive || expired || stale {
				delete(g.leases, ref)
				c.logLeaseLocked(LeaseEvent{Time: now, Group: g.name, Queue: ref, Client: l.owner, Kind: LeaseExpired})
			}
		}
		c.rebalanceLocked(g, sizes[i], gone)
		if len(g.members) == 0 && len(g.leases) == 0 {
			delete(c.groups, g.name)
		}
	}
}

// Leave removes a member at once (its leases are released); the others are
// rebalanced. A member should commit before it leaves.
func (c *Coordinator) Leave(ctx context.Context, group, clientID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[group]
	if g == nil || g.members[clientID] == nil {
		return fmt.Errorf("%w: %s in %s", ErrUnknownMember, clientID, group)
	}
	delete(g.members, clientID)
	g.forgetMemberLocked(clientID)
	now := c.opts.Now()
	for ref, l := range g.leases {
		if l.owner == clientID {
			delete(g.leases, ref)
			c.logLeaseLocked(LeaseEvent{Time: now, Group: group, Queue: ref, Client: clientID, Kind: LeaseReleased})
		}
	}
	c.log.Info().Str("group", group).Str("client", clientID).Msg("member left")
	c.rebalanceLocked(g, c.sizesLocked(g), true)
	return nil
}

// sizesLocked reads topic sizes while holding the lock; the engine's Topic
// is an in-memory lookup, so this is only used on rare paths.
func (c *Coordinator) sizesLocked(g *groupState) map[string]int {
	var subs []Subscription
	for _, m := range g.members {
		subs = append(subs, m.subs...)
	}
	return c.topicSizes(context.Background(), subs, g.name)
}

// Release gives up the member's lease on a queue (after a rebalance took it
// away, once its in-flight messages are done and committed).
func (c *Coordinator) Release(ctx context.Context, group, clientID string, ref QueueRef) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[group]
	if g == nil {
		return fmt.Errorf("%w: %s in %s", ErrUnknownMember, clientID, group)
	}
	if l := g.leases[ref]; l != nil && l.owner == clientID {
		delete(g.leases, ref)
		c.logLeaseLocked(LeaseEvent{Time: c.opts.Now(), Group: group, Queue: ref, Client: clientID, Kind: LeaseReleased})
	}
	return nil
}

// Members lists a group's live members, sorted.
func (c *Coordinator) Members(group string) []MemberInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[group]
	if g == nil {
		return nil
	}
	var out []MemberInfo
	for id, m := range g.members {
		out = append(out, MemberInfo{ClientID: id, Subscriptions: slices.Clone(m.subs), LastHeartbeat: m.lastSeen,
			JoinedAt: m.joinedAt, Queues: slices.Clone(g.assign[id])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ClientID < out[j].ClientID })
	return out
}

// MemberInfo describes a live member.
type MemberInfo struct {
	ClientID      string
	Subscriptions []Subscription
	JoinedAt      time.Time
	LastHeartbeat time.Time
	Queues        []QueueRef
}

// GroupInfo describes a group with live members.
type GroupInfo struct {
	Name    string
	Mode    Mode
	Members []MemberInfo
}

// Groups lists the groups that have live members, sorted by name.
func (c *Coordinator) Groups() []GroupInfo {
	c.mu.Lock()
	names := make([]string, 0, len(c.groups))
	modes := map[string]Mode{}
	for name, g := range c.groups {
		if len(g.members) > 0 {
			names = append(names, name)
			modes[name] = g.mode
		}
	}
	c.mu.Unlock()
	sort.Strings(names)
	out := make([]GroupInfo, 0, len(names))
	for _, n := range names {
		out = append(out, GroupInfo{Name: n, Mode: modes[n], Members: c.Members(n)})
	}
	return out
}
