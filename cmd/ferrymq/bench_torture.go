package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// tortureOptions are the flags of `ferrymq bench torture`.
type tortureOptions struct {
	bin             string
	dir             string
	keep            bool
	duration        time.Duration
	drain           time.Duration
	devices         int
	rate            float64
	size            int
	killEvery       time.Duration
	disconnectEvery time.Duration
	malformedEvery  time.Duration
	commandEvery    time.Duration
	diskFullEvery   time.Duration
	diskFullHold    time.Duration
	diskBytes       int64
	slowWait        time.Duration
	maxRSSMiB       int64
	seed            uint64
	strict          bool
	json            bool
	logLevel        string
}

func (o *tortureOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.bin, "bin", "", "the ferrymq binary to run as the server (default: this executable)")
	f.StringVar(&o.dir, "dir", "", "working folder: data, config, server log (default: a new temporary folder, removed after a passing run)")
	f.BoolVar(&o.keep, "keep", false, "keep the working folder after a passing run")
	f.DurationVar(&o.duration, "duration", time.Minute, "how long the load and the faults last")
	f.DurationVar(&o.drain, "drain", 30*time.Second, "after the load: at most this long for in-flight messages, commands and consumers to settle")
	f.IntVar(&o.devices, "devices", 16, "MQTT devices (a quarter each: 3.1.1 clean, 3.1.1 persistent, 5 clean, 5 persistent)")
	f.Float64Var(&o.rate, "rate", 20, "messages per second per device (QoS 0, 1, 2 mixed 20/35/45 %)")
	f.IntVar(&o.size, "size", 64, "payload bytes (at least the header: device, sequence, QoS, attempt)")
	f.DurationVar(&o.killEvery, "kill-every", 15*time.Second, "SIGKILL and restart the server this often (± 20 %); 0: never")
	f.DurationVar(&o.disconnectEvery, "disconnect-every", time.Second, "cut a random device's TCP connection this often (± 20 %); 0: never")
	f.DurationVar(&o.malformedEvery, "malformed-every", 500*time.Millisecond, "inject a malformed MQTT packet this often; 0: never")
	f.DurationVar(&o.commandEvery, "command-every", 100*time.Millisecond, "produce a point-to-point command this often")
	f.DurationVar(&o.diskFullEvery, "disk-full-every", 0, "fill the data disk this often (0: once, in the middle of the run)")
	f.DurationVar(&o.diskFullHold, "disk-full-hold", 4*time.Second, "how long the disk stays nearly full; 0: never fill it")
	f.Int64Var(&o.diskBytes, "disk-bytes", 512<<20, "size of the tmpfs mounted for the data folder")
	f.DurationVar(&o.slowWait, "slow-consumer-wait", 100*time.Millisecond, "the slow backend's time per message")
	f.Int64Var(&o.maxRSSMiB, "max-rss-mib", 256, "bound on the server's peak VmRSS, MiB; 0: none")
	f.Uint64Var(&o.seed, "seed", 0, "random seed (0: from the clock; printed in the report)")
	f.BoolVar(&o.strict, "strict", false, "count the known gaps (docs/torture.md) as failures")
	f.BoolVar(&o.json, "json", false, "print the report as one JSON line")
	f.StringVar(&o.logLevel, "log-level", "info", "progress log level on stderr: debug, info, warn, error")
}

func (o *tortureOptions) validate() error {
	var errs []error
	if o.duration <= 0 || o.drain <= 0 {
		errs = append(errs, errors.New("--duration and --drain must be positive"))
	}
	if o.devices < 1 || o.devices > 1000 {
		errs = append(errs, errors.New("--devices must be 1 … 1000"))
	}
	if o.rate <= 0 {
		errs = append(errs, errors.New("--rate must be positive"))
	}
	if o.size < 0 || o.size > 64<<10 {
		errs = append(errs, errors.New("--size must be 0 … 64 KiB"))
	}
	if o.commandEvery <= 0 {
		errs = append(errs, errors.New("--command-every must be positive"))
	}
	if o.diskBytes < 64<<20 {
		errs = append(errs, errors.New("--disk-bytes must be at least 64 MiB"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench torture: %w", errors.Join(errs...))
	}
	return nil
}

func newBenchTortureCmd() *cobra.Command {
	o := &tortureOptions{}
	cmd := &cobra.Command{
		Use:   "torture",
		Short: "Run a server under mixed load and faults, then prove nothing acknowledged was lost or reordered",
		Long: `Start ferrymq serve --flush sync as a child process (on loopback, its data on
a small tmpfs), load it with MQTT devices (3.1.1 and 5, clean and persistent
sessions, QoS 0/1/2, each publishing numbered messages one at a time) and
backends (a clustering orderly group, a broadcast group, POP, a slow group,
point-to-point commands with receipts), and meanwhile SIGKILL and restart the
server, cut devices off, fill the disk, inject malformed packets and read
slowly from a subscriber. After --duration and a --drain, read the core and
check: every acknowledged message stored (duplicates only where a resend
explains them), per-device order, every acknowledged command delivered or
receipted expired, consumers complete, no crash, peak RSS within the bound.
docs/torture.md says exactly what each check proves.

The report goes to stdout; the exit status is 1 when a check failed.
Needs root for the tmpfs (otherwise the data folder is a plain folder and the
disk-full window is skipped: the report says so).`,
		Example: `  ferrymq bench torture
  ferrymq bench torture --duration 10m --kill-every 30s --disk-full-every 2m --json
  ferrymq bench torture --bin ./ferrymq --dir /tmp/torture --keep`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			log, err := newLogger(cmd.ErrOrStderr(), true, o.logLevel)
			if err != nil {
				return fmt.Errorf("log level: %w", err)
			}
			rep, err := o.run(cmd.Context(), &log)
			if err != nil {
				return err
			}
			if o.json {
				err = writeTortureJSON(cmd.OutOrStdout(), &rep)
			} else {
				err = writeTortureReport(cmd.OutOrStdout(), &rep)
			}
			if err != nil {
				return err
			}
			if !rep.Passed {
				return fmt.Errorf("torture: %d checks failed", len(rep.Failures))
			}
			return nil
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// run runs the torture and checks it. An error means the run could not be
// carried out (the report is then not a verdict).
func (o *tortureOptions) run(ctx context.Context, log *zerolog.Logger) (tortureReport, error) {
	started := time.Now()
	seed := o.seed
	if seed == 0 {
		seed = uint64(started.UnixNano())
	}
	bin := o.bin
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return tortureReport{}, fmt.Errorf("own executable: %w", err)
		}
	}
	dir := o.dir
	temp := dir == ""
	if temp {
		var err error
		if dir, err = os.MkdirTemp("", "ferrymq-torture-"); err != nil {
			return tortureReport{}, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return tortureReport{}, err
	}
	dir, _ = filepath.Abs(dir)
	log.Info().Str("dir", dir).Uint64("seed", seed).Str("bin", bin).Msg("torture")

	disk := mountDisk(filepath.Join(dir, "data"), o.diskBytes)
	defer func() {
		if err := disk.unmount(); err != nil {
			log.Warn().Err(err).Msg("unmount")
		}
	}()
	if !disk.mounted {
		log.Warn().Str("why", disk.why).Msg("no tmpfs: data in a plain folder, no disk-full window")
	}
	cfg := filepath.Join(dir, "ferrymq.yaml")
	if err := os.WriteFile(cfg, []byte(tortureConfig("torture")), 0o644); err != nil {
		return tortureReport{}, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return tortureReport{}, err
	}
	defer logFile.Close()
	ports, err := freePorts(3)
	if err != nil {
		return tortureReport{}, err
	}
	hp := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
	srv := &tortureServer{bin: bin, data: disk.dir, config: cfg, mqtt: hp(ports[0]), core: hp(ports[1]), http: hp(ports[2]),
		log: log, logFile: logFile}

	runCtx, abort := context.WithCancel(ctx)
	defer abort()
	if err := srv.start(runCtx); err != nil {
		srv.wait()
		return tortureReport{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.stopNow(syscall.SIGKILL)
			srv.wait()
		}
	}()

	quiet := log.Level(zerolog.ErrorLevel) // the clients' reconnect lines would drown the progress
	admin, err := client.Dial(runCtx, client.Options{Addr: srv.core, ClientID: "torture-admin", MaxBackoff: backendMaxRetry, Logger: &quiet})
	if err != nil {
		return tortureReport{}, fmt.Errorf("core: %w", err)
	}
	defer admin.Close()
	if err := createTopics(runCtx, admin); err != nil {
		return tortureReport{}, err
	}

	counters := &tortureCounters{}
	devices := make([]*tortureDevice, o.devices)
	for i := range devices {
		devices[i] = newTortureDevice(i, "tt-", srv.mqtt, o.size, o.rate, seed, counters, log)
	}
	load, endLoad := context.WithTimeout(runCtx, o.duration)
	defer endLoad()
	drain, endDrain := context.WithCancel(runCtx)
	defer endDrain()
	done, endDone := context.WithCancel(runCtx)
	defer endDone()

	be := &tortureBackends{addr: srv.core, log: log.With().Str("component", "backend").Logger().Level(zerolog.ErrorLevel),
		devices: devices, cmdEvery: o.commandEvery, slowWait: o.slowWait, rng: rand.New(rand.NewPCG(seed, 1))}
	if err := be.start(done, load); err != nil {
		endLoad()
		endDone()
		be.close()
		return tortureReport{}, err
	}
	defer be.close()

	var devWG sync.WaitGroup
	idle := make(chan struct{}, len(devices)) // one per device whose publishing ended
	for _, d := range devices {
		devWG.Go(func() {
			d.run(load, drain, done, idle)
		})
	}
	chaos := &tortureChaos{srv: srv, disk: disk, devices: devices, counters: counters, log: *log,
		killEvery: o.killEvery, fullEvery: o.diskFullEvery, fullHold: o.diskFullHold, duration: o.duration,
		mqttAddr: srv.mqtt, abort: abort}
	var chaosWG, watchWG sync.WaitGroup
	chaosWG.Go(func() { chaos.killLoop(load, rand.New(rand.NewPCG(seed, 2))) })
	chaosWG.Go(func() { chaos.disconnectLoop(load, rand.New(rand.NewPCG(seed, 3)), o.disconnectEvery) })
	chaosWG.Go(func() { chaos.malformedLoop(load, rand.New(rand.NewPCG(seed, 4)), o.malformedEvery) })
	watchWG.Go(func() { chaos.slowSubscriber(done) })
	watchWG.Go(func() { chaos.sampleRSS(done) })
	watchWG.Go(func() { chaos.scrapeMetrics(done, "http://"+srv.http+"/metrics") })
	watchWG.Go(func() { o.progress(done, log, started, devices, be, srv, counters) })

	<-load.Done()
	chaosWG.Wait()
	if runCtx.Err() == nil && chaos.refusalOpen() {
		// The disk was filled and freed, the restart that follows did not
		// come yet: do it now, or the store refuses writes to the end.
		srv.kill()
		chaos.restart(runCtx)
		chaos.endRefusal()
	}
	if runCtx.Err() == nil && srv.running() == 0 {
		chaos.restart(runCtx)
	}
	log.Info().Msg("load over: draining")

	// Drain: devices finish their message in flight, commands and consumers
	// catch up; bounded by --drain.
	deadline := time.Now().Add(o.drain)
	idleN := 0
	report := time.NewTicker(5 * time.Second)
	for idleN < len(devices) && time.Now().Before(deadline) && runCtx.Err() == nil {
		select {
		case <-idle:
			idleN++
		case <-report.C:
			for _, d := range devices {
				if p, ok := d.pending(); ok {
					log.Info().Str("device", d.id).Int64("seq", p.Seq).Int("qos", int(p.QoS)).Int("attempts", p.Attempts).
						Int("sends", p.Sends).Msg("still waiting for an acknowledgement")
				}
			}
		case <-time.After(time.Until(deadline)):
		case <-runCtx.Done():
		}
	}
	report.Stop()
	endDrain() // devices give up on what is still unacknowledged
	for idleN < len(devices) {
		<-idle
		idleN++
	}
	log.Info().Dur("drained", time.Since(deadline.Add(-o.drain)).Round(time.Millisecond)).Msg("devices idle")
	o.settle(runCtx, admin, be, devices, srv, chaos, deadline, log)
	log.Info().Dur("drained", time.Since(deadline.Add(-o.drain)).Round(time.Millisecond)).Msg("settled: reading the core")

	stored, readErr := readStored(context.WithoutCancel(runCtx), admin)
	obs := tortureObs{Stored: stored, Kills: srv.killTimes(), RSS: chaos.samples(), MaxRSS: o.maxRSSMiB << 20,
		Refusing: chaos.refusals(), Strict: o.strict}
	for _, d := range devices {
		obs.Devices = append(obs.Devices, d.obs())
	}
	obs.Commands, obs.Receipts = be.snapshot()
	obs.Consumers = be.consumers()

	endDone()
	devWG.Wait()
	watchWG.Wait()
	be.close()
	stopErr := srv.stop()
	stopped = true
	srv.wait()
	log.Info().Dur("elapsed", time.Since(started).Round(time.Millisecond)).Msg("server stopped: checking")
	if runCtx.Err() != nil && ctx.Err() == nil && readErr == nil {
		readErr = errors.New("the run was aborted: the server could not be restarted")
	}
	if readErr != nil {
		return tortureReport{}, fmt.Errorf("%w (server log %s)", readErr, logFile.Name())
	}
	if ctx.Err() != nil {
		return tortureReport{}, fmt.Errorf("interrupted: %w", ctx.Err())
	}

	obs.Faults = srv.faultList()
	if stopErr != nil {
		obs.Faults = append(obs.Faults, "graceful stop: "+stopErr.Error())
	}
	panics, errorLines, err := runtimePanics(logFile.Name())
	if err != nil {
		return tortureReport{}, fmt.Errorf("read server log: %w", err)
	}
	obs.Faults = append(obs.Faults, panics...)

	rep := checkTorture(&obs)
	rep.Run = o.runCounts(started, disk, chaos, counters, be, devices)
	rep.Run.Notes = append(rep.Run.Notes, fmt.Sprintf("seed %d; server %d starts; %d error lines in its log (%s)",
		seed, srv.startCount(), errorLines, logFile.Name()))
	if !rep.Passed && disk.mounted {
		// The tmpfs goes with the run: keep a copy of what failed.
		saved := filepath.Join(dir, "data-saved")
		if err := os.CopyFS(saved, os.DirFS(disk.dir)); err != nil {
			log.Warn().Err(err).Msg("copy the data folder")
		} else {
			rep.Run.Notes = append(rep.Run.Notes, "data folder copied to "+saved)
		}
	}
	if !rep.Passed || o.keep || !temp {
		rep.Run.Notes = append(rep.Run.Notes, "working folder kept: "+dir)
	} else {
		defer func() {
			if err := disk.unmount(); err == nil {
				_ = os.RemoveAll(dir)
			}
		}()
	}
	return rep, nil
}

// settle waits, until deadline, for every acknowledged command to be
// accounted for and every consumer that must keep up to have had every
// stored message.
func (o *tortureOptions) settle(ctx context.Context, admin *client.Client, be *tortureBackends, devices []*tortureDevice,
	srv *tortureServer, chaos *tortureChaos, deadline time.Time, log *zerolog.Logger) {
	for ctx.Err() == nil {
		obs := tortureObs{Kills: srv.killTimes()}
		for _, d := range devices {
			obs.Devices = append(obs.Devices, d.obs())
		}
		obs.Commands, obs.Receipts = be.snapshot()
		obs.Refusing = chaos.refusals()
		var f, known findings
		dl := checkDownlink(&obs, &f, &known)
		var behind int64
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ranges, err := topicRanges(rctx, admin)
		cancel()
		if err == nil {
			for _, l := range be.mustCover() {
				behind += l.missing(ranges)
			}
		}
		if err == nil && dl.Undelivered == 0 && behind == 0 {
			return
		}
		if !time.Now().Before(deadline) {
			ev := log.Warn().Int("commands_open", dl.Undelivered).Int64("consumers_behind", behind).Err(err)
			if x := f.byCheck[checkUndelivered]; x != nil {
				ev = ev.Strs("open", x.Examples)
			}
			ev.Msg("drain time over")
			return
		}
		pause(ctx, 250*time.Millisecond)
	}
}

// progress logs a line every 5 s.
func (o *tortureOptions) progress(ctx context.Context, log *zerolog.Logger, started time.Time, devices []*tortureDevice,
	be *tortureBackends, srv *tortureServer, counters *tortureCounters) {
	every(ctx, 5*time.Second, func() {
		pub, acked := 0, 0
		for _, d := range devices {
			d.mu.Lock()
			pub += len(d.pubs)
			for _, p := range d.pubs {
				if p.Acked && p.QoS > 0 {
					acked++
				}
			}
			d.mu.Unlock()
		}
		cmds, rcpts := be.snapshot()
		log.Info().Dur("elapsed", time.Since(started).Round(time.Second)).Int("published", pub).Int("acked", acked).
			Int("orderly", be.orderly.count()).Int("pop", be.pop.count()).Int("slow", be.slow.count()).
			Int("commands", len(cmds)).Int("receipts", len(rcpts)).Int("kills", len(srv.killTimes())).
			Int64("disconnects", counters.disconnects.Load()).Int64("reconnects", counters.reconnects.Load()).
			Int("server_pid", srv.running()).Msg("progress")
	})
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func (o *tortureOptions) runCounts(started time.Time, disk *tortureDisk, chaos *tortureChaos, counters *tortureCounters,
	be *tortureBackends, devices []*tortureDevice) runCounts {
	malformed, shut := chaos.malformedCounts()
	lat := mqttbench.NewHistogram()
	for _, d := range devices {
		d.mu.Lock()
		lat.Merge(d.lat)
		d.mu.Unlock()
	}
	r := runCounts{Started: started, Seconds: time.Since(started).Seconds(), Disk: disk.describe(o.diskBytes),
		DiskFull: int(chaos.diskFull.Load()), Disconnects: int(counters.disconnects.Load()), Sleeps: int(counters.sleeps.Load()), Reconnects: int(counters.reconnects.Load()),
		Refused: int(counters.refused.Load()), Malformed: malformed, MalformedShut: shut,
		SlowSubBytes: chaos.slowBytes.Load(), SlowSubDrops: int(chaos.slowDrops.Load()), SlowBackend: be.slow.count(),
		AckP50: lat.Quantile(0.5), AckP99: lat.Quantile(0.99), AckMax: lat.Quantile(1), Metrics: chaos.metricTotals()}
	if n := be.badReceipts(); n > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d receipts did not parse", n))
	}
	return r
}
