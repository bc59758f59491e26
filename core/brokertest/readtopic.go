package brokertest

import (
	"context"
	"errors"

	"github.com/ferrymq/ferrymq/core"
)

// ReadTopic reads every message of topic, queue by queue from each queue's
// first readable offset, following NextOffset; none if the topic does not
// exist. It returns its error rather than failing a test, so a poll's
// condition (which runs on a goroutine of its own) may call it.
func ReadTopic(ctx context.Context, b core.Broker, topic string) ([]*core.StoredMessage, error) {
	info, err := b.Topic(ctx, topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*core.StoredMessage
	for q := range len(info.Ranges) { // retired queues of a resized topic too
		for off := info.Ranges[q].Min; ; {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 256})
			if err != nil {
				return nil, err
			}
			out = append(out, res.Messages...)
			if res.NextOffset == off {
				break
			}
			off = res.NextOffset
		}
	}
	return out, nil
}
