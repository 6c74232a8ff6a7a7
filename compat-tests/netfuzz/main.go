// netfuzz sends mutated real Kafka requests to a running broker over many
// connections at once, for a bounded time, while a watchdog asks a fresh
// connection for ApiVersions every second and samples the broker process's
// resident memory from /proc. It prints one JSON line of figures:
//
//	netfuzz -bootstrap 127.0.0.1:9092 -pid 1234 -seconds 60 -corpus DIR
//
// The corpus is the protocol crate's request_stream fuzz corpus (a piece
// byte, then size-prefixed frames) or any directory of raw frames. The
// run stops by itself after -seconds, or at once when the process dies.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Result is what a run measured; run.sh prints one column per broker from it.
type Result struct {
	Label              string  `json:"label"`
	Seconds            float64 `json:"seconds"`
	Connections        int64   `json:"connections"`
	Requests           int64   `json:"requests"`
	Responses          int64   `json:"responses"`
	ClosedByBroker     int64   `json:"closed_by_broker"`
	BytesSent          int64   `json:"bytes_sent"`
	Died               bool    `json:"died"`
	DiedAfterSeconds   float64 `json:"died_after_seconds,omitempty"`
	PeakRSSMiB         float64 `json:"peak_rss_mib"`
	StartRSSMiB        float64 `json:"start_rss_mib"`
	LivenessChecks     int64   `json:"liveness_checks"`
	LivenessFailures   int64   `json:"liveness_failures"`
	MaxApiVersionsMs   float64 `json:"max_api_versions_ms"`
	Seed               int64   `json:"seed"`
	CorpusFrames       int     `json:"corpus_frames"`
	FirstLivenessError string  `json:"first_liveness_error,omitempty"`
}

func main() {
	bootstrap := flag.String("bootstrap", "127.0.0.1:9092", "broker address")
	pid := flag.Int("pid", 0, "broker process id, for RSS and death (0: not watched)")
	seconds := flag.Float64("seconds", 60, "how long to run")
	conns := flag.Int("conns", 32, "concurrent fuzzing connections")
	corpus := flag.String("corpus", "", "directory of request frames")
	seed := flag.Int64("seed", time.Now().UnixNano(), "random seed (printed; replays the same mutations)")
	label := flag.String("label", "broker", "name for the result")
	livenessTimeout := flag.Duration("liveness-timeout", 5*time.Second, "how long ApiVersions may take")
	flag.Parse()

	frames, err := loadCorpus(*corpus)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netfuzz:", err)
		os.Exit(2)
	}
	res := run(*bootstrap, *pid, time.Duration(*seconds*float64(time.Second)), *conns, frames, *seed, *livenessTimeout)
	res.Label = *label
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

// loadCorpus reads every file under dir: a request_stream input when it is
// one piece byte followed by whole size-prefixed frames, else one raw frame.
func loadCorpus(dir string) ([][]byte, error) {
	var frames [][]byte
	if dir != "" {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return nil, err
			}
			if fs, ok := splitStream(data); ok {
				frames = append(frames, fs...)
			} else if len(data) >= 8 {
				frames = append(frames, data)
			}
		}
	}
	if len(frames) == 0 {
		frames = append(frames, apiVersionsFrame(1), metadataAllTopicsFrame(2))
	}
	return frames, nil
}

func splitStream(data []byte) ([][]byte, bool) {
	if len(data) < 5 {
		return nil, false
	}
	rest := data[1:]
	var frames [][]byte
	for len(rest) > 0 {
		if len(rest) < 4 {
			return nil, false
		}
		n := int(int32(binary.BigEndian.Uint32(rest)))
		if n < 8 || n > len(rest)-4 {
			return nil, false
		}
		frames = append(frames, rest[4:4+n])
		rest = rest[4+n:]
	}
	return frames, len(frames) > 0
}

// apiVersionsFrame is ApiVersions v3 (header v2, client software name and
// version), what every modern client sends first.
func apiVersionsFrame(correlationID int32) []byte {
	b := []byte{0, 18, 0, 3}
	b = binary.BigEndian.AppendUint32(b, uint32(correlationID))
	client := "netfuzz-watchdog"
	b = binary.BigEndian.AppendUint16(b, uint16(len(client)))
	b = append(b, client...)
	b = append(b, 0) // header tagged fields
	b = append(b, byte(len("netfuzz")+1))
	b = append(b, "netfuzz"...)
	b = append(b, 2, '1', 0) // version "1", body tagged fields
	return b
}

// metadataAllTopicsFrame is Metadata v1 with a null topic array: all topics.
func metadataAllTopicsFrame(correlationID int32) []byte {
	b := []byte{0, 3, 0, 1}
	b = binary.BigEndian.AppendUint32(b, uint32(correlationID))
	b = binary.BigEndian.AppendUint16(b, 7)
	b = append(b, "netfuzz"...)
	b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	return b
}

func run(addr string, pid int, dur time.Duration, conns int, frames [][]byte, seed int64, livenessTimeout time.Duration) Result {
	res := Result{Seed: seed, CorpusFrames: len(frames)}
	start := time.Now()
	deadline := start.Add(dur)
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	var connections, requests, responses, closed, sent atomic.Int64

	res.StartRSSMiB = rssMiB(pid, "VmRSS")
	var wg sync.WaitGroup
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			fuzzConnection(addr, rng, frames, stop, &connections, &requests, &responses, &closed, &sent)
		}(w)
	}

	// The watchdog: a fresh connection's ApiVersions every second, RSS four
	// times a second, and the process's existence.
	var peakRSS float64
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	nextCheck := time.Now()
	var checkID int32 = 1000
	for time.Now().Before(deadline) {
		select {
		case <-ticker.C:
		case <-stop:
		}
		if pid != 0 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil || isZombie(pid) {
				res.Died = true
				res.DiedAfterSeconds = time.Since(start).Seconds()
				break
			}
			if r := rssMiB(pid, "VmRSS"); r > peakRSS {
				peakRSS = r
			}
		}
		if time.Now().After(nextCheck) {
			nextCheck = time.Now().Add(time.Second)
			checkID++
			took, err := apiVersions(addr, checkID, livenessTimeout)
			res.LivenessChecks++
			if ms := float64(took) / float64(time.Millisecond); ms > res.MaxApiVersionsMs {
				res.MaxApiVersionsMs = ms
			}
			if err != nil {
				res.LivenessFailures++
				if res.FirstLivenessError == "" {
					res.FirstLivenessError = fmt.Sprintf("after %.1f s: %v", time.Since(start).Seconds(), err)
				}
			}
		}
	}
	halt()
	wg.Wait()
	if pid != 0 && !res.Died {
		// The kernel's own high-water mark catches a peak between samples.
		if hwm := rssMiB(pid, "VmHWM"); hwm > peakRSS {
			peakRSS = hwm
		}
	}
	res.PeakRSSMiB = peakRSS
	res.Seconds = time.Since(start).Seconds()
	res.Connections = connections.Load()
	res.Requests = requests.Load()
	res.Responses = responses.Load()
	res.ClosedByBroker = closed.Load()
	res.BytesSent = sent.Load()
	return res
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// rssMiB reads a /proc/<pid>/status field in MiB (0 when unreadable).
func rssMiB(pid int, field string) float64 {
	if pid == 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field+":") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// apiVersions opens a connection, sends ApiVersions v3 and waits for the
// answer with the same correlation id.
func apiVersions(addr string, id int32, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return time.Since(start), err
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(timeout))
	if err := writeFrame(c, apiVersionsFrame(id)); err != nil {
		return time.Since(start), err
	}
	body, err := readFrame(c, 1<<20)
	if err != nil {
		return time.Since(start), err
	}
	if len(body) < 6 || int32(binary.BigEndian.Uint32(body)) != id {
		return time.Since(start), errors.New("ApiVersions answer with another correlation id")
	}
	if code := int16(binary.BigEndian.Uint16(body[4:])); code != 0 {
		return time.Since(start), fmt.Errorf("ApiVersions error code %d", code)
	}
	return time.Since(start), nil
}

func writeFrame(w io.Writer, body []byte) error {
	b := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	_, err := w.Write(append(b, body...))
	return err
}

func readFrame(r io.Reader, max int) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.BigEndian.Uint32(size[:])))
	if n < 0 || n > max {
		return nil, fmt.Errorf("response of %d bytes", n)
	}
	body := make([]byte, n)
	_, err := io.ReadFull(r, body)
	return body, err
}

// fuzzConnection keeps one connection busy with mutated requests until
// stop, reconnecting whenever the broker closes it.
func fuzzConnection(addr string, rng *rand.Rand, frames [][]byte, stop chan struct{},
	connections, requests, responses, closed, sent *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		connections.Add(1)
		exchange(c, rng, frames, stop, requests, responses, closed, sent)
		c.Close()
	}
}

// exchange sends requests on one connection, reading each answer (up to a
// short deadline: acks=0 produce and refused requests get none) until the
// connection fails or a run of requests is done.
func exchange(c net.Conn, rng *rand.Rand, frames [][]byte, stop chan struct{},
	requests, responses, closed, sent *atomic.Int64) {
	perConn := 1 + rng.Intn(50)
	for i := 0; i < perConn; i++ {
		select {
		case <-stop:
			return
		default:
		}
		frame := mutate(rng, frames)
		wire := make([]byte, 4, 4+len(frame))
		size := uint32(len(frame))
		lie := rng.Intn(40) == 0
		if lie {
			// A size prefix that promises more than is sent: a stalled
			// partial frame, given up after a moment.
			size += uint32(1 + rng.Intn(1<<20))
		}
		binary.BigEndian.PutUint32(wire, size)
		wire = append(wire, frame...)
		_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Write(wire)
		sent.Add(int64(n))
		if err != nil {
			closed.Add(1)
			return
		}
		requests.Add(1)
		if lie {
			time.Sleep(time.Duration(rng.Intn(300)) * time.Millisecond)
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := readFrame(c, 256<<20); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return
			}
			closed.Add(1)
			return
		}
		responses.Add(1)
	}
}

var interesting32 = []uint32{0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 0x7fff, 0xffff, 0x10000, 1 << 20}
var interesting16 = []uint16{0, 1, 0x7fff, 0x8000, 0xffff, 0xff}

// mutate returns a mutated copy of a random corpus frame. The api key,
// version and correlation id (the first 8 bytes) are mostly kept, so the
// request reaches its handler; one time in ten the frame goes unchanged.
func mutate(rng *rand.Rand, frames [][]byte) []byte {
	src := frames[rng.Intn(len(frames))]
	out := append([]byte(nil), src...)
	if rng.Intn(10) == 0 {
		return out
	}
	edits := 1 + rng.Intn(6)
	for e := 0; e < edits; e++ {
		lo := 8
		if rng.Intn(20) == 0 || len(out) <= lo {
			lo = 0
		}
		if len(out) <= lo {
			out = append(out, byte(rng.Intn(256)))
			continue
		}
		at := lo + rng.Intn(len(out)-lo)
		switch rng.Intn(9) {
		case 0:
			out[at] ^= 1 << uint(rng.Intn(8))
		case 1:
			out[at] = byte(rng.Intn(256))
		case 2:
			if at+4 <= len(out) {
				binary.BigEndian.PutUint32(out[at:], interesting32[rng.Intn(len(interesting32))])
			}
		case 3:
			if at+2 <= len(out) {
				binary.BigEndian.PutUint16(out[at:], interesting16[rng.Intn(len(interesting16))])
			}
		case 4:
			out = out[:at]
		case 5:
			// Repeat a region, growing an array or a string.
			end := at + 1 + rng.Intn(min(64, len(out)-at))
			region := append([]byte(nil), out[at:end]...)
			for k := rng.Intn(64); k >= 0; k-- {
				out = append(out[:end], append(region, out[end:]...)...)
			}
		case 6:
			other := frames[rng.Intn(len(frames))]
			if len(other) > 8 {
				from := 8 + rng.Intn(len(other)-8)
				out = append(out[:at], other[from:]...)
			}
		case 7:
			out = append(out[:at], out[at+1:]...)
		default:
			out = append(out[:at], append([]byte{byte(rng.Intn(256))}, out[at:]...)...)
		}
	}
	return out
}
