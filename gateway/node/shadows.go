package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/shadow/bucket"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/shadowmqtt"
)

// shadowOptions are Options.Shadows with the node's logger.
func (n *Node) shadowOptions() shadow.Options {
	so := *n.opts.Shadows
	if so.Logger == nil {
		so.Logger = n.log
	}
	return so
}

// startShadowsEmbedded opens device shadows over the embedded store: the
// topic device-shadows is their record, the snapshot in DataDir/shadows.
func (n *Node) startShadowsEmbedded() error {
	if n.opts.Shadows == nil {
		return nil
	}
	var err error
	if n.shadows, err = shadow.OpenLog(context.Background(), n.store, filepath.Join(n.opts.DataDir, "shadows"),
		n.shadowOptions(), shadow.LogOptions{}); err != nil {
		return fmt.Errorf("device shadows: %w", err)
	}
	return nil
}

// startShadowsNATS opens device shadows in the JetStream bucket every node
// shares (not on a read-only standby).
func (n *Node) startShadowsNATS(ctx context.Context) error {
	nc := n.opts.NATS
	if n.opts.Shadows == nil || nc.MirrorOf != "" {
		return nil
	}
	return n.whileUnavailable(ctx, "device shadows", func() (err error) {
		n.shadows, err = bucket.Open(ctx, n.engine.JetStream(), n.engine, n.shadowOptions(),
			bucket.Options{Replicas: nc.Replicas, Timeout: nc.Timeout})
		return err
	})
}

// newShadowDevices builds the MQTT face of the shadows (nil without
// them): the bridge hands it $shadow/… publishes and the connections.
func (n *Node) newShadowDevices(acl engine.Authorizer) error {
	if n.shadows == nil {
		return nil
	}
	var err error
	n.devices, err = shadowmqtt.New(shadowmqtt.Options{Shadows: n.shadows, ACL: acl, Logger: n.log})
	return err
}

// stopShadows closes what the shadow functions above opened.
func (n *Node) stopShadows() error {
	var errs []error
	if n.devices != nil {
		errs = append(errs, n.devices.Close())
		n.devices = nil
	}
	if n.shadows != nil {
		errs = append(errs, n.shadows.Close())
		n.shadows = nil
	}
	return errors.Join(errs...)
}

// shadowCollector exports the shadow service's request counts.
type shadowCollector struct {
	svc      *shadow.Service
	requests *prometheus.Desc
}

func newShadowCollector(svc *shadow.Service) *shadowCollector {
	return &shadowCollector{svc: svc, requests: prometheus.NewDesc("ferrymq_shadow_requests_total",
		"Device shadow updates and deletes since start, by section (desired, reported, delete) and outcome (accepted, conflict, too_large, bad_request, not_found, error).",
		[]string{"section", "outcome"}, nil)}
}

func (c *shadowCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.requests }

func (c *shadowCollector) Collect(ch chan<- prometheus.Metric) {
	for k, v := range c.svc.Requests() {
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(v), k.Section, k.Outcome)
	}
}
