package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/listener"
	"github.com/ferrymq/ferrymq/session"
)

// newGateway builds the MQTT gateway and its bridge from flags and the
// config file's mqtt and bridge sections.
func (o *serveOptions) newGateway(st *store.Store, log *zerolog.Logger) (*gateway.Gateway, error) {
	mc, bc := o.file.MQTT, o.file.Bridge
	down, err := bc.downlinkRules()
	if err != nil {
		return nil, err
	}
	br, err := bridge.New(bridge.Options{
		Broker:          st,
		Uplink:          bc.Uplink,
		EventsTopic:     bc.EventsTopic,
		DisableEvents:   bc.DisableEvents,
		MaxInflight:     bc.MaxInflight,
		Downlink:        down,
		DisableDownlink: bc.DisableDownlink,
		ReceiptsTopic:   bc.ReceiptsTopic,
		DisableReceipts: bc.DisableReceipts,
		Logger:          log,
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	var lns []gateway.Listener
	if o.mqttAddr != "" {
		lns = append(lns, gateway.Listener{Type: "tcp", Addr: o.mqttAddr})
	}
	if o.wsAddr != "" {
		lns = append(lns, gateway.Listener{Type: "ws", Addr: o.wsAddr, Path: mc.WS.Path})
	}
	for i, t := range mc.TLS {
		if t.Cert == "" || t.Key == "" {
			return nil, fmt.Errorf("mqtt tls listener %d: cert and key are required", i+1)
		}
		cfg, err := listener.LoadTLS(t.Cert, t.Key, t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("mqtt tls listener %d: %w", i+1, err)
		}
		lns = append(lns, gateway.Listener{Name: t.Name, Type: t.Type, Addr: t.Addr, Path: t.Path, TLS: cfg})
	}
	if len(lns) == 0 {
		return nil, errors.New("no mqtt listener: give --mqtt, --ws or a tls listener")
	}
	sessions, err := session.Open(filepath.Join(o.dataDir, "sessions"), session.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Options{
		Listeners:        lns,
		Hooks:            []mqtt.Hook{br, sessions},
		MaxPacketBytes:   mc.MaxPacketBytes,
		ConnectTimeout:   time.Duration(mc.ConnectTimeout),
		MaxKeepalive:     mc.MaxKeepalive,
		WriteTimeout:     time.Duration(mc.WriteTimeout),
		MaxPendingWrites: mc.MaxPendingWrites,
		ReadBufferBytes:  mc.ReadBufferBytes,
		WriteBufferBytes: mc.WriteBufferBytes,
		ReceiveMaximum:   mc.ReceiveMaximum,
		MaxInflight:      mc.MaxInflight,
		MaxClients:       mc.MaxClients,
		Store:            st,
		Logger:           log,
	})
	if err != nil {
		_ = sessions.Close()
		return nil, err
	}
	return gw, nil
}
