package rpc

import (
	"fmt"
	"strings"

	"github.com/ferrymq/ferrymq/core"
)

const (
	topicPrefix    = "$rpc/"
	requestLevel   = "/request/"
	responseLevel  = "/response/"
	errBadResponse = "not $rpc/{client}/response/{id}"
)

// RequestTopic is the topic a call's request reaches clientID on.
func RequestTopic(clientID, id string) string { return topicPrefix + clientID + requestLevel + id }

// ResponseTopic is the topic clientID answers call id on.
func ResponseTopic(clientID, id string) string { return topicPrefix + clientID + responseLevel + id }

// parseResponse splits "$rpc/{client}/response/{id}". The client ID may
// hold '/': the ID is the last level and has no '/'.
func parseResponse(topic string) (client string, id core.MessageID, err error) {
	rest, ok := strings.CutPrefix(topic, topicPrefix)
	i := strings.LastIndex(rest, responseLevel)
	if !ok || i <= 0 {
		return "", id, fmt.Errorf("%w: %q: %s", ErrBadRequest, topic, errBadResponse)
	}
	client, hex := rest[:i], rest[i+len(responseLevel):]
	if id, err = core.ParseMessageID(hex); err != nil || id.Kind() != IDKindCall {
		return "", core.MessageID{}, fmt.Errorf("%w: %q: not a call ID", ErrBadRequest, topic)
	}
	return client, id, nil
}
