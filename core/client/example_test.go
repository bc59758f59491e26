package client_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/server"
	"github.com/ferrymq/ferrymq/core/store"
)

// exampleServer runs a core server on a loopback port, as `ferrymq serve`
// does, and returns its address and a function that stops it.
func exampleServer() (string, func()) {
	dir, _ := os.MkdirTemp("", "ferrymq-example")
	st, _ := store.Open(dir, store.Options{IndexSlots: 1 << 10, IndexEntries: 1 << 12})
	gc, _ := group.New(st, group.Options{})
	gc.Start()
	rs, _ := retry.New(st, retry.Options{})
	rs.Start()
	ps, _ := pop.New(st, rs, pop.Options{})
	ps.Start()
	srv, _ := server.New(server.Options{Addr: "127.0.0.1:0", Broker: st, Groups: gc, Retry: rs, Pop: ps})
	_ = srv.Start()
	return srv.Addr().String(), func() {
		_ = srv.Shutdown(context.Background())
		_ = ps.Close()
		_ = rs.Close()
		_ = gc.Close()
		_ = st.Close()
		_ = os.RemoveAll(dir)
	}
}

// A backend sends a command for one car and another backend consumes it in
// a consumer group.
func Example() {
	addr, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	c, err := client.Dial(ctx, client.Options{Addr: addr})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// Messages with one sharding key keep their order.
	p := c.NewProducer()
	if _, err := p.Send(ctx, &core.Message{Topic: "commands", ShardingKey: "car-42", Body: []byte("unlock")}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("sent")

	got := make(chan string, 1)
	pc, err := c.NewPushConsumer(consumer.Options{
		Group:         "door-service",
		Subscriptions: []group.Subscription{{Topic: "commands"}},
		Listener: func(ctx context.Context, m *core.StoredMessage) consumer.Result {
			got <- m.ShardingKey + ": " + string(m.Body)
			return consumer.Success
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := pc.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got)
	_ = pc.Close(ctx) // commits and leaves the group
	// Output:
	// sent
	// car-42: unlock
}

// POP consumption: receive, process, acknowledge.
func ExampleSimpleConsumer() {
	addr, stop := exampleServer()
	defer stop()
	ctx := context.Background()
	c, _ := client.Dial(ctx, client.Options{Addr: addr})
	defer c.Close()
	_, _ = c.NewProducer().Send(ctx, &core.Message{Topic: "jobs", Body: []byte("resize photo 7")})

	sc := c.NewSimpleConsumer("workers", "jobs")
	sc.Invisible = 30 * time.Second // others will not see it meanwhile
	msgs, _ := sc.Receive(ctx, 10, 5*time.Second)
	for _, m := range msgs {
		fmt.Println(string(m.Body), "attempt", m.Attempt)
		_ = sc.Ack(ctx, m.Handle)
	}
	// Output:
	// resize photo 7 attempt 1
}
