package node

import (
	"cmp"
	"net/http"
	"time"

	"github.com/ferrymq/ferrymq/gateway/admin"
)

// ConfigSummary is what GET /api/v1/node shows of the configuration: where
// things are and which features are on — never a token, a secret or a
// credential file's content.
type ConfigSummary struct {
	Data       string   `json:"data"`
	Flush      string   `json:"flush"`
	Retention  string   `json:"retention"`
	Core       string   `json:"core"`
	CoreRemote string   `json:"core_remote,omitempty"`
	HTTP       string   `json:"http"`
	MQTT       string   `json:"mqtt,omitempty"`
	WebSocket  string   `json:"ws,omitempty"`
	TokenSet   bool     `json:"token_set"`
	Auth       bool     `json:"auth"`
	TraceAll   bool     `json:"trace_all,omitempty"`
	Traced     []string `json:"traced_topics,omitempty"`
	Engine     string   `json:"engine"`
	NATS       int      `json:"nats_servers,omitempty"`
}

// summary is the ConfigSummary of o, as given (before defaults).
func (o *Options) summary() ConfigSummary {
	s := ConfigSummary{Data: o.DataDir, Flush: string(o.Store.FlushPolicy), Retention: o.Store.Retention.String(), CoreRemote: o.CoreRemote,
		HTTP: o.HTTPAddr, MQTT: o.MQTTAddr, WebSocket: o.WSAddr, TokenSet: o.Token != "", Auth: o.Auth != nil,
		Engine: cmp.Or(o.Engine, EngineEmbedded)}
	if o.Core != nil {
		s.Core = o.Core.Addr
	}
	if o.Trace != nil {
		s.TraceAll, s.Traced = o.Trace.All, o.Trace.Topics
	}
	if o.CoreRemote == "" && s.Engine == EngineNATS {
		s.NATS = len(o.NATS.URLs)
	}
	return s
}

// adminHandler builds the admin API; withCore adds the store's endpoints
// (topics, groups, dead letters), which need the core services. With no
// token (loopback only) writes are allowed.
func (n *Node) adminHandler(withCore bool) (http.Handler, error) {
	cfg := n.summary
	cfg.TokenSet = n.token != "" // given or generated
	opts := admin.Options{Gateway: n.gateway, Calls: n.rpc, Sessions: n.sessions, Shadows: n.shadows,
		Node: cmp.Or(n.nodeName, hostname()), Version: n.version(), Config: cfg, Started: time.Now(),
		Authorize: admin.BearerAuthorizer(n.token), AllowWrites: n.token == "", Logger: n.log}
	if withCore {
		opts.Groups, opts.Retry = n.groups, n.retry
		if n.engine != nil {
			opts.Broker = n.frontBroker() // every node's, outliving the terms (which set n.broker)
		} else {
			opts.Broker = n.broker
		}
	}
	if n.engine != nil {
		opts.Engine = EngineNATS
	}
	return admin.New(opts)
}
