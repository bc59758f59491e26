package main

import (
	"cmp"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/gateway/node"
)

// The modes serve runs in: the engine, or a gateway in front of a remote
// core (--core-remote, whatever the engine says).
const (
	modeEmbedded   = node.EngineEmbedded
	modeNATS       = node.EngineNATS
	modeCoreRemote = "core-remote"
)

// mode is the mode o runs in.
func (o *serveOptions) mode() string {
	if o.remote != "" {
		return modeCoreRemote
	}
	return cmp.Or(o.engine, modeEmbedded)
}

// ignoredSetting is a config key or a flag that was given but does not
// apply in the running mode.
type ignoredSetting struct {
	Key string // a config key path ("store.segment_bytes") or a flag ("--node")
	Why string
}

// ignoredRule says which settings a mode ignores, and why. A key matches
// itself and every key path below it.
type ignoredRule struct {
	modes []string // empty: every mode
	flags []string
	keys  []string
	why   string
}

// modeRules are the settings each mode ignores whatever else is set.
var modeRules = []ignoredRule{
	{modes: []string{modeCoreRemote}, flags: []string{"flush", "segment-bytes", "retention"}, keys: []string{"flush", "store"},
		why: "the gateway has no store: the remote core's settings apply"},
	{modes: []string{modeCoreRemote}, flags: []string{"core"}, keys: []string{"core.addr", "core.max_frame_bytes", "core.advertise", "http.max_body_bytes", "delay", "retry", "transactions"},
		why: "the core services (the core port, the HTTP produce and consume API) run on the remote core"},
	{modes: []string{modeCoreRemote}, flags: []string{"engine", "nats"}, keys: []string{"engine", "nats"},
		why: "the gateway uses no engine of its own: the remote core's applies"},
	{modes: []string{modeCoreRemote}, flags: []string{"node"},
		why: "the gateway is named by bridge.node (default the host name) and its process ID"},
	{modes: []string{modeNATS}, flags: []string{"flush", "segment-bytes"}, keys: []string{"flush", "store.segment_bytes", "store.group_commit_delay"},
		why: "JetStream streams have no commit-log flush or segments (the NATS servers' sync_interval decides)"},
	{modes: []string{modeNATS}, keys: []string{"store.tail_cache_bytes", "store.reader_cold_read_bytes_per_sec", "store.cold_read_bytes_per_sec", "store.cold_read_max_bytes"},
		why: "the tail cache and the cold-read budgets are the embedded commit log's"},
	{modes: []string{modeNATS}, keys: []string{"trace.node"},
		why: "trace hops name the NATS node (--node, nats.node, bridge.node or the host name)"},
	{modes: []string{modeEmbedded}, flags: []string{"nats"}, keys: []string{"nats"},
		why: "the engine is embedded, not nats"},
	{modes: []string{modeEmbedded}, flags: []string{"node"},
		why: "names a node of a NATS cluster: the embedded engine only shows it in the admin API"},
	{keys: []string{"mqtt.read_buffer_bytes", "mqtt.write_buffer_bytes"},
		why: "the MQTT engine keeps no buffer for an idle connection"},
}

// ignoredSettings lists the settings given (flags that given reports,
// config keys in cfg) that do not apply when o runs in mode, one per key,
// in the order of the rules.
func ignoredSettings(mode string, o *serveOptions, cfg fileConfig, given func(flag string) bool) []ignoredSetting {
	rules := slices.Clone(modeRules)
	if !cfg.Trace.All && len(cfg.Trace.Topics) == 0 {
		rules = append(rules, ignoredRule{keys: []string{"trace.node", "trace.sample"}, why: "nothing is traced: trace.all is false and trace.topics empty"})
	}
	if cfg.Trace.All {
		rules = append(rules, ignoredRule{keys: []string{"trace.topics"}, why: "trace.all traces every topic"})
	}
	if o.wsAddr == "" {
		rules = append(rules, ignoredRule{keys: []string{"mqtt.ws.path"}, why: "the WebSocket listener is off (--ws, mqtt.ws.addr)"})
	}
	if o.mqttAddr == "" {
		rules = append(rules, ignoredRule{keys: []string{"mqtt.proxy_protocol"}, why: "the MQTT TCP listener is off (--mqtt, mqtt.addr)"})
	}
	if !slices.ContainsFunc(cfg.MQTT.TLS, func(t tlsListenerConfig) bool { return t.ClientCA != "" }) {
		rules = append(rules, ignoredRule{keys: []string{"auth.mtls"}, why: "no TLS listener asks for a client certificate (mqtt.tls client_ca)"})
	}
	if getenv("GOGC") != "" {
		rules = append(rules, ignoredRule{flags: []string{"gc-percent"}, keys: []string{"gc_percent"}, why: "the GOGC environment variable wins"})
	}
	var out []ignoredSetting
	for _, r := range rules {
		if len(r.modes) > 0 && !slices.Contains(r.modes, mode) {
			continue
		}
		for _, f := range r.flags {
			if given(f) {
				out = append(out, ignoredSetting{Key: "--" + f, Why: r.why})
			}
		}
		for _, k := range r.keys {
			for _, p := range leafKeys(cfg.keys, k) {
				out = append(out, ignoredSetting{Key: p, Why: r.why})
			}
		}
	}
	return out
}

// leafKeys are the paths of keys that are key or below it and have no key
// below them.
func leafKeys(keys []string, key string) []string {
	var leaves []string
	for _, p := range keys {
		if p != key && !strings.HasPrefix(p, key+".") {
			continue
		}
		if !slices.ContainsFunc(keys, func(q string) bool { return strings.HasPrefix(q, p+".") }) {
			leaves = append(leaves, p)
		}
	}
	return leaves
}

// Log field names of the warnings.
const (
	logKey    = "key"
	logMode   = "mode"
	logReason = "reason"
)

// warnIgnored logs one warning per ignored setting.
func warnIgnored(log *zerolog.Logger, mode string, ignored []ignoredSetting) {
	for _, s := range ignored {
		log.Warn().Str(logKey, s.Key).Str(logMode, mode).Str(logReason, s.Why).Msg("setting does not apply in this mode: ignored")
	}
}
