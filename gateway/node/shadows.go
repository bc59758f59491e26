package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ferrymq/ferrymq/core/shadow"
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
		n.shadows, err = shadow.OpenKV(ctx, n.engine.JetStream(), n.engine, n.shadowOptions(),
			shadow.KVOptions{Replicas: nc.Replicas, Timeout: nc.Timeout})
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
