// Command pushbench is the measuring half of bench/push.sh: it serves the
// push endpoint a dispatcher queue pushes to (HTTP, answering 200 after
// -delay), fills the queue while it is paused, resumes it, and times how
// fast the dispatcher pushes every message to the endpoint and acks it.
//
// The rate is -messages divided by the time from the resume to the moment
// the endpoint has answered every message (each message id once); "all acked"
// is the time until the queue's stats show nothing left (depth 0, nothing in
// flight). It prints one RESULT line of key=value pairs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is what one run does; flags fill it.
type Config struct {
	Dispatcher  string
	Queue       string
	Listen      string
	Delay       time.Duration
	Messages    int
	Size        int
	Concurrency int // the queue's push concurrency, for the Little's-law bound
	Timeout     time.Duration
}

func main() {
	cfg := Config{}
	flag.StringVar(&cfg.Dispatcher, "dispatcher", "http://127.0.0.1:8080", "the dispatcher's HTTP API")
	flag.StringVar(&cfg.Queue, "queue", "", "the pushed queue (required)")
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:9000", "where the push endpoint listens (the queue's push url)")
	flag.DurationVar(&cfg.Delay, "delay", 0, "how long the endpoint takes to answer")
	flag.IntVar(&cfg.Messages, "messages", 0, "messages to push (required)")
	flag.IntVar(&cfg.Size, "size", 1024, "payload bytes")
	flag.IntVar(&cfg.Concurrency, "concurrency", 0, "the queue's push concurrency (reported, and the Little's-law bound)")
	flag.DurationVar(&cfg.Timeout, "timeout", 300*time.Second, "give up after this long")
	flag.Parse()
	if cfg.Queue == "" || cfg.Messages < 1 || cfg.Size < 1 || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res := Run(context.Background(), cfg, lis)
	fmt.Println(res.Line(cfg))
	if res.Status != "ok" {
		fmt.Fprintln(os.Stderr, "error:", res.Err)
		os.Exit(1)
	}
}

// Endpoint is the push endpoint: it answers 200 after Delay and counts each
// message id once.
type Endpoint struct {
	Delay    time.Duration
	Expect   int
	mu       sync.Mutex
	seen     map[string]bool
	requests atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
	noID     atomic.Int64
	doneAt   time.Time
	done     chan struct{}
}

func NewEndpoint(delay time.Duration, expect int) *Endpoint {
	return &Endpoint{Delay: delay, Expect: expect, seen: map[string]bool{}, done: make(chan struct{})}
}

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	for {
		m := e.maxIn.Load()
		if n <= m || e.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	e.requests.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	if e.Delay > 0 {
		time.Sleep(e.Delay)
	}
	id := r.Header.Get("Dispatcher-Message-Id")
	if id == "" {
		e.noID.Add(1)
		http.Error(w, "no Dispatcher-Message-Id header", http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen[id] {
		e.seen[id] = true
		if len(e.seen) == e.Expect {
			e.doneAt = time.Now()
			close(e.done)
		}
	}
}

// Result is what one run measured.
type Result struct {
	Status      string
	Elapsed     time.Duration // resume -> every message answered
	AllAcked    time.Duration // resume -> depth 0, nothing in flight
	Answered    int
	Requests    int64
	MaxInFlight int64
	Err         string
}

// Line is the RESULT line.
func (r Result) Line(cfg Config) string {
	rate := 0.0
	if r.Elapsed > 0 {
		rate = float64(cfg.Messages) / r.Elapsed.Seconds()
	}
	bound := -1.0
	if cfg.Delay > 0 && cfg.Concurrency > 0 {
		bound = float64(cfg.Concurrency) / cfg.Delay.Seconds()
	}
	return fmt.Sprintf("RESULT status=%s delay_ms=%d concurrency=%d messages=%d size=%d elapsed_s=%.3f msgs_per_s=%.1f"+
		" all_acked_s=%.3f answered=%d requests=%d duplicates=%d max_in_flight=%d littles_law_bound=%.0f",
		r.Status, cfg.Delay.Milliseconds(), cfg.Concurrency, cfg.Messages, cfg.Size, r.Elapsed.Seconds(), rate,
		r.AllAcked.Seconds(), r.Answered, r.Requests, r.Requests-int64(r.Answered), r.MaxInFlight, bound)
}

// Run serves the endpoint on lis, pauses the queue, produces the messages,
// resumes it and waits for every answer and then for the queue to drain.
func Run(parent context.Context, cfg Config, lis net.Listener) Result {
	ctx, cancel := context.WithTimeout(parent, cfg.Timeout)
	defer cancel()
	ep := NewEndpoint(cfg.Delay, cfg.Messages)
	srv := &http.Server{Handler: ep}
	go srv.Serve(lis)
	defer srv.Close()
	api := &api{base: strings.TrimRight(cfg.Dispatcher, "/") + "/queues/" + url.PathEscape(cfg.Queue)}

	fail := func(err error) Result {
		return Result{Status: "error", Err: err.Error(), Requests: ep.requests.Load()}
	}
	if err := api.post(ctx, "/pause", nil, nil); err != nil {
		return fail(err)
	}
	if err := produce(ctx, api, cfg); err != nil {
		return fail(err)
	}
	if n := ep.requests.Load(); n != 0 {
		return fail(fmt.Errorf("%d pushes while the queue was paused", n))
	}
	start := time.Now()
	if err := api.post(ctx, "/resume", nil, nil); err != nil {
		return fail(err)
	}
	res := Result{Status: "ok"}
	select {
	case <-ep.done:
		res.Elapsed = ep.doneAt.Sub(start)
	case <-ctx.Done():
		res.Status, res.Err = "timeout", "not every message was pushed in time"
	}
	if res.Status == "ok" {
		if err := drained(ctx, api); err != nil {
			res.Status, res.Err = "timeout", err.Error()
		} else {
			res.AllAcked = time.Since(start)
		}
	}
	ep.mu.Lock()
	res.Answered = len(ep.seen)
	ep.mu.Unlock()
	res.Requests = ep.requests.Load()
	res.MaxInFlight = ep.maxIn.Load()
	if n := ep.noID.Load(); n > 0 && res.Status == "ok" {
		res.Status, res.Err = "error", fmt.Sprintf("%d pushes without a message id", n)
	}
	return res
}

// produce enqueues cfg.Messages messages through the produce API, 500 at a time.
func produce(ctx context.Context, a *api, cfg Config) error {
	payload := strings.Repeat("x", cfg.Size)
	type msg struct {
		Payload string `json:"payload"`
	}
	for sent := 0; sent < cfg.Messages; {
		n := min(500, cfg.Messages-sent)
		batch := make([]msg, n)
		for i := range batch {
			batch[i].Payload = payload
		}
		var out struct {
			Results []struct {
				Status string `json:"status"`
			} `json:"results"`
		}
		if err := a.post(ctx, "/messages", map[string]any{"messages": batch}, &out); err != nil {
			return err
		}
		if len(out.Results) != n {
			return fmt.Errorf("produce: %d results for %d messages", len(out.Results), n)
		}
		sent += n
	}
	return nil
}

// drained waits until the queue's stats show depth 0 and nothing in flight.
func drained(ctx context.Context, a *api) error {
	for {
		var stats struct {
			Depth    *int64 `json:"depth"`
			InFlight *int64 `json:"in_flight"`
		}
		if err := a.get(ctx, &stats); err != nil {
			return err
		}
		if stats.Depth == nil || stats.InFlight == nil {
			return errors.New("queue stats without depth or in_flight")
		}
		if *stats.Depth == 0 && *stats.InFlight == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the queue did not drain: depth %d, in flight %d", *stats.Depth, *stats.InFlight)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type api struct{ base string }

func (a *api) post(ctx context.Context, path string, body, out any) error {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(req, out)
}

func (a *api) get(ctx context.Context, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base, nil)
	if err != nil {
		return err
	}
	return do(req, out)
}

func do(req *http.Request, out any) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %.200s", req.Method, req.URL.Path, resp.StatusCode, raw)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}
