package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// The server under torture: `ferrymq serve --flush sync` as a child
// process on fixed loopback ports (so that clients find it again after a
// restart), its data folder on a small tmpfs when one can be mounted.

// tortureServer supervises the child. start, kill and stop are called from
// one goroutine at a time (the runner, then the chaos loop, then the
// runner); the watcher goroutine of each incarnation reports its exit.
type tortureServer struct {
	bin, data, config string
	mqtt, core, http  string
	log               *zerolog.Logger
	logFile           *os.File // the children's stderr, appended across incarnations

	mu       sync.Mutex
	cmd      *exec.Cmd
	pid      int
	exited   chan struct{} // closed when the current child ended
	expected bool          // its end was asked for (kill or stop)
	faults   []string
	kills    []time.Time
	starts   int
	wg       sync.WaitGroup // the watchers
}

// freePorts picks n loopback ports below the kernel's ephemeral range (so
// that no client socket takes one while the server restarts) that are free
// now.
func freePorts(n int) ([]int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				low = v
			}
		}
	}
	var ports []int
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 10000 + rand.IntN(low-10000)
		if slices.Contains(ports, p) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = ln.Close()
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("no free loopback ports below the ephemeral range")
	}
	return ports, nil
}

// tortureConfig is the serve configuration: the default bridge, with the
// bounds that keep memory per connection and per queue bounded spelled out.
func tortureConfig(node string) string {
	return `# written by ferrymq bench torture
log: {level: info}
store:
  max_message_bytes: 1048576
mqtt:
  max_packet_bytes: 1048576   # oversized packets are refused from the fixed header
  connect_timeout: 5s
  write_timeout: 10s          # a subscriber that stops reading is dropped
  max_pending_writes: 256     # packets queued per connection
  max_inflight: 1024          # outbound QoS 1/2 awaiting acks per client
  receive_maximum: 256
bridge:
  node: ` + node + `
  max_inflight: 256           # uplink publishes in flight per client
  offline_max_messages: 1000
  offline_max_bytes: 1048576
`
}

func (s *tortureServer) args() []string {
	return []string{"serve", "--config", s.config, "--data", s.data, "--flush", "sync",
		"--mqtt", s.mqtt, "--core", s.core, "--http", s.http, "--ws", "", "--segment-bytes", strconv.Itoa(16 << 20)}
}

// start runs a new incarnation and waits until it serves MQTT and the core.
func (s *tortureServer) start(ctx context.Context) error {
	var out bytes.Buffer
	outMu := &sync.Mutex{}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "FERRYMQ_") })
	cmd.Stderr = s.logFile
	// If this process dies, so does the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("serve stdout: %w", err)
	}
	cmd.Stdout = pw
	s.mu.Lock()
	s.starts++
	n := s.starts
	s.mu.Unlock()
	fmt.Fprintf(s.logFile, "{\"torture\":\"start %d\",\"time\":%q}\n", n, time.Now().UTC().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	_ = pw.Close()
	exited := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.pid, s.exited, s.expected = cmd, cmd.Process.Pid, exited, false
	s.mu.Unlock()
	ready := make(chan struct{})
	s.wg.Go(func() { // stdout: the printed addresses
		sc := bufio.NewScanner(pr)
		seen := 0
		for sc.Scan() {
			l := sc.Text()
			outMu.Lock()
			out.WriteString(l + "\n")
			outMu.Unlock()
			if strings.HasPrefix(l, "tcp ") || strings.HasPrefix(l, "core ") {
				if seen++; seen == 2 {
					close(ready)
				}
			}
		}
		_ = pr.Close()
	})
	s.wg.Go(func() { // the watcher
		err := cmd.Wait()
		s.mu.Lock()
		expected := s.expected
		s.mu.Unlock()
		if !expected {
			s.fault(fmt.Sprintf("serve (pid %d) exited by itself: %v", cmd.Process.Pid, err))
		}
		close(exited)
	})
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-exited:
		outMu.Lock()
		defer outMu.Unlock()
		s.fault(fmt.Sprintf("serve start %d failed; stdout: %q", n, out.String()))
		return fmt.Errorf("serve exited at start (see %s)", s.logFile.Name())
	case <-t.C:
		s.fault(fmt.Sprintf("serve start %d: no addresses within 60 s", n))
		_ = s.stopNow(syscall.SIGKILL)
		return fmt.Errorf("serve did not start within 60 s (see %s)", s.logFile.Name())
	case <-ctx.Done():
		_ = s.stopNow(syscall.SIGKILL)
		return ctx.Err()
	}
}

func (s *tortureServer) fault(msg string) {
	s.mu.Lock()
	s.faults = append(s.faults, msg)
	s.mu.Unlock()
	s.log.Error().Str("fault", msg).Msg("server fault")
}

// running: the pid of the live child, or 0.
func (s *tortureServer) running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	select {
	case <-s.exited:
		return 0
	default:
		return s.pid
	}
}

// kill SIGKILLs the child and waits until it is gone.
func (s *tortureServer) kill() {
	s.mu.Lock()
	s.kills = append(s.kills, time.Now())
	s.mu.Unlock()
	_ = s.stopNow(syscall.SIGKILL)
}

// stopNow signals the child (its end is expected) and waits for it.
func (s *tortureServer) stopNow(sig syscall.Signal) error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.expected = true
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	<-exited
	return nil
}

// stop asks the child to shut down cleanly (SIGINT) and reports whether it
// did within 30 s with status 0; otherwise it is killed.
func (s *tortureServer) stop() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.expected = true
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil // already gone (a fault, recorded)
	default:
	}
	_ = cmd.Process.Signal(os.Interrupt)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-exited:
		if st := cmd.ProcessState; st != nil && !st.Success() {
			return fmt.Errorf("serve exited with %s after SIGINT", st)
		}
		return nil
	case <-t.C:
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("serve did not stop within 30 s of SIGINT")
	}
}

func (s *tortureServer) killTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.kills...)
}

func (s *tortureServer) faultList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.faults...)
}

func (s *tortureServer) startCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts
}

// wait waits for the watcher goroutines (after the last stop).
func (s *tortureServer) wait() { s.wg.Wait() }

// runtimePanics scans the children's stderr for Go runtime crashes (not the
// read-path panics the gateway recovers and logs).
func runtimePanics(path string) ([]string, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var out []string
	errorsLogged := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "panic: "), strings.HasPrefix(l, "fatal error: "), strings.Contains(l, "DATA RACE"):
			out = append(out, "serve crashed: "+l)
		case strings.Contains(l, `"level":"error"`):
			errorsLogged++
		}
	}
	return out, errorsLogged, sc.Err()
}

// readRSS reads VmRSS and its parts from /proc/pid/status.
func readRSS(pid int) (rssSample, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return rssSample{}, err
	}
	s := rssSample{At: time.Now(), PID: pid}
	for l := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			s.RSS = v << 10
		case "RssAnon":
			s.Anon = v << 10
		case "RssFile":
			s.File = v << 10
		case "RssShmem":
			s.Shmem = v << 10
		case "Threads":
			s.Threads = int(v)
		}
	}
	return s, nil
}

// The data folder's disk: a tmpfs of a fixed size mounted for the run (so
// that a filler file can take it to nearly full), or a plain folder when
// that cannot be mounted.

type tortureDisk struct {
	dir     string
	mounted bool
	why     string // why not mounted
}

func mountDisk(dir string, size int64) *tortureDisk {
	d := &tortureDisk{dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		d.why = err.Error()
		return d
	}
	err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+strconv.FormatInt(size, 10)+",mode=0755")
	if err != nil {
		d.why = fmt.Sprintf("mount -t tmpfs: %v", err)
		return d
	}
	d.mounted = true
	return d
}

func (d *tortureDisk) describe(size int64) string {
	if d.mounted {
		return fmt.Sprintf("tmpfs %s", fmtBytes(size))
	}
	return "plain folder (" + d.why + "; the near-full window is skipped)"
}

// free is what the disk has left.
func (d *tortureDisk) free() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// fill writes a filler file until only leave bytes are free (or the disk
// is full); remove it with unfill.
func (d *tortureDisk) fill(leave int64) (int64, error) {
	free, err := d.free()
	if err != nil {
		return 0, err
	}
	f, err := os.Create(filepath.Join(d.dir, "torture-filler"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < free-leave {
		k := min(int64(len(buf)), free-leave-n)
		w, err := f.Write(buf[:k])
		n += int64(w)
		if err != nil {
			return n, nil // full already: good enough
		}
	}
	return n, nil
}

func (d *tortureDisk) unfill() error {
	err := os.Remove(filepath.Join(d.dir, "torture-filler"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// unmount detaches the tmpfs (lazily if something still holds it).
func (d *tortureDisk) unmount() error {
	if !d.mounted {
		return nil
	}
	if err := syscall.Unmount(d.dir, 0); err != nil {
		if err2 := syscall.Unmount(d.dir, syscall.MNT_DETACH); err2 != nil {
			return fmt.Errorf("umount %s: %w", d.dir, err)
		}
	}
	d.mounted = false
	return nil
}
