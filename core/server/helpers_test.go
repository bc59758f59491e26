package server_test

import (
	"errors"
	"net"

	"github.com/ferrymq/ferrymq/core"
)

func coreTopic(name string, queues int) core.TopicConfig {
	return core.TopicConfig{Name: name, Queues: queues}
}

func coreMsg(topic, body string) *core.Message {
	return &core.Message{Topic: topic, Body: []byte(body)}
}

func isTimeout(err error, ne *net.Error) bool { return errors.As(err, ne) && (*ne).Timeout() }
