package main

import (
	"cmp"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/admin"
)

// configSummary is what GET /api/v1/node shows of the configuration: where
// things are and which features are on — never a token, a secret or a
// credential file's content.
type configSummary struct {
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

func (o *serveOptions) summary() configSummary {
	return configSummary{Data: o.dataDir, Flush: o.flush, Retention: o.retention.String(), Core: o.coreAddr, CoreRemote: o.remote,
		HTTP: o.httpAddr, MQTT: o.mqttAddr, WebSocket: o.wsAddr, TokenSet: o.token != "", Auth: o.file.Auth != nil,
		TraceAll: o.file.Trace.All, Traced: o.file.Trace.Topics, Engine: cmp.Or(o.engine, "embedded")}
}

// adminHandler builds the admin API; withCore adds the store's endpoints
// (topics, groups, dead letters), which need the core services.
func (n *node) adminHandler(log *zerolog.Logger, withCore bool) (http.Handler, error) {
	opts := admin.Options{Gateway: n.gateway, Sessions: n.sessions,
		Node: cmp.Or(n.nodeName, hostname()), Version: "ferrymq " + buildVersion(), Config: n.summary, Started: time.Now(),
		Authorize: admin.BearerAuthorizer(n.token), AllowWrites: n.token == "", Logger: log}
	if withCore {
		opts.Broker, opts.Groups, opts.Retry = n.broker, n.groups, n.retry
	}
	if n.engine != nil {
		opts.Engine = "nats"
	}
	return admin.New(opts)
}

// mountAdmin serves the admin API's paths on h, behind the token when one
// is set; with no token (loopback only) writes are allowed.
func (n *node) mountAdmin(h *http.ServeMux, log *zerolog.Logger) error {
	adm, err := n.adminHandler(log, n.store != nil)
	if err != nil {
		return err
	}
	for _, p := range admin.Patterns() {
		h.Handle(p, requireToken(n.token, adm))
	}
	return nil
}
