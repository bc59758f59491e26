package gateway_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// mosquittoTool finds a Debian mosquitto-clients binary. .ci/run installs
// them and sets FERRYMQ_REQUIRE_MOSQUITTO=1, so CI fails instead of skipping.
func mosquittoTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("FERRYMQ_REQUIRE_MOSQUITTO") != "" {
			t.Fatalf("%s not installed (apt-get install mosquitto-clients)", name)
		}
		t.Skipf("%s not installed; apt-get install mosquitto-clients (CI requires it)", name)
	}
	return p
}

// Debian's mosquitto_pub and mosquitto_sub, as real outside clients over
// MQTT 3.1.1 and 5: what mosquitto_pub sends reaches mosquitto_sub and is
// in the core under the client ID, in order.
func TestMosquittoClients(t *testing.T) {
	pub, sub := mosquittoTool(t, "mosquitto_pub"), mosquittoTool(t, "mosquitto_sub")
	env := gatewaytest.Start(t, gatewaytest.Options{})
	host, port, _ := strings.Cut(env.TCP, ":")
	_, err := strconv.Atoi(port)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	subCmd := exec.CommandContext(ctx, sub, "-h", host, "-p", port, "-i", "watcher", "-q", "1", "-t", "alerts/#", "-C", "6", "-v")
	var subOut strings.Builder
	subCmd.Stdout = &subOut
	require.NoError(t, subCmd.Start())
	require.Eventually(t, func() bool {
		return env.Gateway.Engine().Subscribers("alerts/x") == 1
	}, 10*time.Second, 10*time.Millisecond)

	for _, v := range []string{"mqttv311", "mqttv5"} {
		cmd := exec.CommandContext(ctx, pub, "-h", host, "-p", port, "-V", v, "-i", "dev-"+v, "-q", "1", "-t", "alerts/dev-"+v, "-l")
		cmd.Stdin = strings.NewReader("one\ntwo\nthree\n")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", v, out)
	}
	require.NoError(t, subCmd.Wait(), "mosquitto_sub received all six")
	for _, v := range []string{"mqttv311", "mqttv5"} {
		for _, b := range []string{"one", "two", "three"} {
			require.Contains(t, subOut.String(), "alerts/dev-"+v+" "+b+"\n")
		}
	}
	got := byKey(readAll(t, env.Store, "alerts"))
	require.Equal(t, []string{"one", "two", "three"}, got["dev-mqttv311"])
	require.Equal(t, []string{"one", "two", "three"}, got["dev-mqttv5"])
}
