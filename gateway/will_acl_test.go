package gateway_test

import (
	"context"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// A will is a publish of its client: the ACL applies to it, to the inner
// topic of a "$delayed/…" will too, which is then delayed like a publish.
func TestWillACL(t *testing.T) {
	acl, err := auth.NewACL([]auth.ACLRule{{Action: auth.ActionAllow, Publish: []string{"cars/%c/#"}}})
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: &delay.Options{},
		Auth: auth.NewHook(auth.HookOptions{Chain: &auth.Chain{AllowAnonymous: true}, ACL: acl})})
	will := func(id, topic string) {
		dialV3(t, env.TCP, id, func(o *paho3.ClientOptions) { o.SetWill(topic, "offline-"+id, 1, true) })
	}
	will("c1", "cars/c2/cmd")           // another device's topic: refused
	will("c3", "cars/c3/status")        // its own: published
	will("c4", "$delayed/60/cars/c4/s") // its own, delayed a minute
	will("c5", "$delayed/60/cars/c6/s") // another's, delayed: refused
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, env.Gateway.Shutdown(ctx))

	cars := readAll(t, env.Store, "cars")
	require.Len(t, cars, 1)
	require.Equal(t, "offline-c3", string(cars[0].Body))
	waiting := readAll(t, env.Store, delay.DelayTopic)
	require.Len(t, waiting, 1)
	require.Equal(t, "offline-c4", string(waiting[0].Body))
	require.Equal(t, "cars", waiting[0].Properties[delay.PropTopic])
	require.Equal(t, "cars/c4/s", waiting[0].Properties[bridge.PropTopic])
	require.Equal(t, "60", waiting[0].Properties[bridge.PropDelay])
}
