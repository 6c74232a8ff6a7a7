// Command loadgen is the dispatcher half of bench/dispatcher.sh: N pull
// workers, each looping receive -> ack over the dispatcher's HTTP/JSON API
// (-api http) or its gRPC API (-api grpc, grpc.go), until M acks have come
// back "ok" in total. It prints one RESULT line of
// key=value pairs (the same keys as bench/dispatcher/share-bench prints),
// which bench/dispatcher/report.py reads.
//
// The rate is measured from the first non-empty receive of any worker to the
// moment the M-th ok ack came back, so the dispatcher's own start (group join,
// partition assignment) is left out; it is reported as first_message_ms.
// Latency is per cycle: from sending a receive that returned messages to the
// ack response for them.
//
// With -prefetch a worker asks for its next batch before it acks the one it
// holds (at most two batches leased per worker), so the receive's round trip
// overlaps the ack's; its acks are still confirmed before it takes up the
// next batch.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is what one run does; flags fill it.
type Config struct {
	API      string // http or grpc
	BaseURL  string
	GRPCAddr string
	Queue    string
	Workers  int
	Messages int64
	Batch    int
	Wait     time.Duration
	Lease    time.Duration
	Timeout  time.Duration
	// MaxErrors bounds consecutive failed requests of one worker before the
	// run gives up: a dispatcher that answers nothing but errors must not keep
	// the harness busy until the timeout.
	MaxErrors int
	// Prefetch: keep the next receive in flight while acking a batch.
	Prefetch bool
}

// Result is what one run measured.
type Result struct {
	Status          string // ok, timeout or error
	Acked           int64  // ok acks in total (may pass Messages by the last cycles in flight)
	Counted         int64  // Messages when the run completed, else Acked
	Elapsed         time.Duration
	Cycles          int64
	Redelivered     int64 // received with attempt > 1
	Failed          int64 // receipts whose ack status was not ok
	Errors          int64 // failed HTTP requests
	FirstMessage    time.Duration
	LatenciesSorted []time.Duration
	// The two halves of each cycle: the receive's round trip, and the ack's.
	ReceiveSorted []time.Duration
	AckSorted     []time.Duration
	LastError     string
}

func main() {
	cfg := Config{}
	flag.StringVar(&cfg.API, "api", "http", "the API the workers use: http (JSON) or grpc")
	flag.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:8080", "the dispatcher's HTTP API (-api http)")
	flag.StringVar(&cfg.GRPCAddr, "grpc", "127.0.0.1:8081", "the dispatcher's gRPC API, host:port (-api grpc)")
	flag.StringVar(&cfg.Queue, "queue", "", "queue name (required)")
	flag.IntVar(&cfg.Workers, "workers", 4, "concurrent pull workers")
	flag.Int64Var(&cfg.Messages, "messages", 0, "stop after this many ok acks (required)")
	flag.IntVar(&cfg.Batch, "batch", 100, "max_messages of each receive")
	flag.DurationVar(&cfg.Wait, "wait", time.Second, "wait_seconds of each receive (whole seconds)")
	flag.DurationVar(&cfg.Lease, "lease", 60*time.Second, "lease_seconds of each receive (whole seconds)")
	flag.DurationVar(&cfg.Timeout, "timeout", 300*time.Second, "give up after this long, print what was acked, exit 1")
	flag.IntVar(&cfg.MaxErrors, "max-errors", 50, "consecutive failed requests of one worker before the run gives up")
	flag.BoolVar(&cfg.Prefetch, "prefetch", false, "keep each worker's next receive in flight while it acks its batch")
	flag.Parse()
	if cfg.Queue == "" || cfg.Messages < 1 || cfg.Workers < 1 || cfg.Batch < 1 || flag.NArg() != 0 ||
		(cfg.API != "http" && cfg.API != "grpc") {
		flag.Usage()
		os.Exit(2)
	}
	var newAPI func() (api, error)
	if cfg.API == "grpc" {
		newAPI = func() (api, error) { return newGRPCAPI(cfg) }
	} else {
		newAPI = httpAPIs(cfg, newClient(cfg.Workers))
	}
	res := Run(context.Background(), cfg, newAPI)
	if res.LastError != "" {
		fmt.Fprintf(os.Stderr, "last error: %s\n", res.LastError)
	}
	fmt.Println(res.Line(cfg))
	if res.Status != "ok" {
		os.Exit(1)
	}
}

// newClient keeps one idle keep-alive connection per worker, so that no
// cycle pays for a new TCP connection.
func newClient(workers int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = workers * 2
	t.MaxIdleConnsPerHost = workers * 2
	return &http.Client{Transport: t}
}

// Line is the RESULT line.
func (r Result) Line(cfg Config) string {
	secs := r.Elapsed.Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(r.Counted) / secs
	}
	first := -1.0
	if r.FirstMessage > 0 {
		first = float64(r.FirstMessage) / float64(time.Millisecond)
	}
	commit := "ack"
	if cfg.Prefetch {
		commit = "ack-prefetch"
	}
	return fmt.Sprintf("RESULT status=%s api=%s workers=%d batch=%d commit=%s acked=%d counted=%d elapsed_s=%.3f"+
		" msgs_per_s=%.1f p50_ms=%.2f p99_ms=%.2f receive_p50_ms=%.2f receive_p99_ms=%.2f ack_p50_ms=%.2f ack_p99_ms=%.2f"+
		" cycles=%d redelivered=%d failed=%d errors=%d first_message_ms=%.0f",
		r.Status, cfg.API, cfg.Workers, cfg.Batch, commit, r.Acked, r.Counted, secs, rate,
		percentileMs(r.LatenciesSorted, 0.50), percentileMs(r.LatenciesSorted, 0.99),
		percentileMs(r.ReceiveSorted, 0.50), percentileMs(r.ReceiveSorted, 0.99),
		percentileMs(r.AckSorted, 0.50), percentileMs(r.AckSorted, 0.99),
		r.Cycles, r.Redelivered, r.Failed, r.Errors, first)
}

// percentileMs is the nearest-rank percentile in ms (NaN without samples).
func percentileMs(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return float64(sorted[rank-1]) / float64(time.Millisecond)
}

// run state shared by the workers.
type run struct {
	cfg         Config
	start       time.Time
	acked       atomic.Int64
	failed      atomic.Int64
	redelivered atomic.Int64
	errors      atomic.Int64
	cycles      atomic.Int64
	firstNs     atomic.Int64 // since start; 0 until the first message
	doneNs      atomic.Int64 // since start; 0 until Messages ok acks
	stop        context.CancelFunc
	mu          sync.Mutex
	lastErr     string
	gaveUp      atomic.Bool
}

// api is what a worker needs of the dispatcher: receive, and ack.
type api interface {
	receive(ctx context.Context, consumer string) ([]receivedMessage, error)
	// ack acks receipts and returns how many came back ok, and how many not.
	ack(ctx context.Context, receipts []string) (ok, notOK int64, err error)
	Close() error
}

// Run drives cfg.Workers workers, each with an api from newAPI, until
// cfg.Messages ok acks, the timeout, or a worker giving up after
// cfg.MaxErrors consecutive errors.
func Run(parent context.Context, cfg Config, newAPI func() (api, error)) Result {
	ctx, cancel := context.WithTimeout(parent, cfg.Timeout)
	defer cancel()
	r := &run{cfg: cfg, start: time.Now(), stop: cancel}
	apis := make([]api, cfg.Workers)
	for i := range apis {
		a, err := newAPI()
		if err != nil {
			return Result{Status: "error", LastError: err.Error()}
		}
		defer a.Close()
		apis[i] = a
	}
	latencies := make([]workerLatencies, cfg.Workers)
	var wg sync.WaitGroup
	for i := 0; i < cfg.Workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			latencies[i] = r.work(ctx, apis[i], fmt.Sprintf("w%d", i))
		}(i)
	}
	wg.Wait()

	var all, receives, acks []time.Duration
	for _, l := range latencies {
		all = append(all, l.cycle...)
		receives = append(receives, l.receive...)
		acks = append(acks, l.ack...)
	}
	for _, d := range [][]time.Duration{all, receives, acks} {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	res := Result{
		Acked:           r.acked.Load(),
		Cycles:          r.cycles.Load(),
		Redelivered:     r.redelivered.Load(),
		Failed:          r.failed.Load(),
		Errors:          r.errors.Load(),
		LatenciesSorted: all,
		ReceiveSorted:   receives,
		AckSorted:       acks,
		LastError:       r.lastErr,
	}
	first, done := r.firstNs.Load(), r.doneNs.Load()
	end := done
	switch {
	case done != 0:
		res.Status, res.Counted = "ok", cfg.Messages
	case r.gaveUp.Load():
		res.Status, res.Counted = "error", res.Acked
		end = int64(time.Since(r.start))
	default:
		res.Status, res.Counted = "timeout", res.Acked
		end = int64(time.Since(r.start))
	}
	if first != 0 {
		res.FirstMessage = time.Duration(first)
		res.Elapsed = time.Duration(end - first)
	}
	return res
}

// workerLatencies are one worker's cycles that returned messages, whole
// and in halves.
type workerLatencies struct {
	cycle, receive, ack []time.Duration
}

// received is one receive's answer and when it was asked for.
type received struct {
	msgs  []receivedMessage
	err   error
	start time.Time
}

// work is one pull worker: receive, ack what came, repeat. With
// cfg.Prefetch it asks for its next batch before it acks the one it holds
// (at most two batches leased at a time); a cycle then runs from the
// receive of a batch to its ack, including the time the batch waited while
// the previous one was acked.
func (r *run) work(ctx context.Context, a api, consumer string) workerLatencies {
	var latencies workerLatencies
	receive := func() received {
		start := time.Now()
		msgs, err := a.receive(ctx, consumer)
		return received{msgs, err, start}
	}
	var next chan received
	if r.cfg.Prefetch {
		next = make(chan received, 1)
		go func() { next <- receive() }()
	}
	consecutiveErrors := 0
	for ctx.Err() == nil {
		var got received
		if next != nil {
			got = <-next
			go func() { next <- receive() }()
		} else {
			got = receive()
		}
		err := got.err
		if err == nil && len(got.msgs) > 0 {
			err = r.ackBatch(ctx, a, got, &latencies)
		}
		if err != nil {
			if !r.failedRequest(ctx, err, &consecutiveErrors) {
				break
			}
			continue
		}
		consecutiveErrors = 0
	}
	if next != nil {
		<-next // the receive still in flight ends with ctx
	}
	return latencies
}

// ackBatch acks a received batch and, once the ack answered, counts it.
func (r *run) ackBatch(ctx context.Context, a api, got received, latencies *workerLatencies) error {
	r.firstNs.CompareAndSwap(0, int64(time.Since(r.start)))
	receipts := make([]string, len(got.msgs))
	for i, m := range got.msgs {
		receipts[i] = m.Receipt
		if m.Attempt > 1 {
			r.redelivered.Add(1)
		}
	}
	ackStart := time.Now()
	ok, notOK, err := a.ack(ctx, receipts)
	if err != nil {
		return err
	}
	r.failed.Add(notOK)
	latencies.cycle = append(latencies.cycle, time.Since(got.start))
	latencies.receive = append(latencies.receive, ackStart.Sub(got.start))
	latencies.ack = append(latencies.ack, time.Since(ackStart))
	r.cycles.Add(1)
	r.confirm(ok)
	return nil
}

// failedRequest counts a failed request and pauses briefly; false when the
// worker must stop (the run was stopped, or it gave up).
func (r *run) failedRequest(ctx context.Context, err error, consecutive *int) bool {
	if ctx.Err() != nil {
		return false // stopped mid-request: not an error of the dispatcher
	}
	r.errors.Add(1)
	r.noteError(err)
	*consecutive++
	if *consecutive >= r.cfg.MaxErrors {
		r.gaveUp.Store(true)
		r.stop()
		return false
	}
	// A short pause, so that a dispatcher that is still starting is not hammered.
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
	return true
}

func (r *run) confirm(n int64) {
	after := r.acked.Add(n)
	if after >= r.cfg.Messages && after-n < r.cfg.Messages {
		r.doneNs.Store(int64(time.Since(r.start)))
		r.stop()
	}
}

func (r *run) noteError(err error) {
	r.mu.Lock()
	r.lastErr = err.Error()
	r.mu.Unlock()
}

// receivedMessage is the part of a received message the load generator reads.
// The HTTP side decodes the receipt and attempt only (encoding/json still
// scans every payload); the gRPC side also copies out the message id and the
// payload, as generated code would.
type receivedMessage struct {
	MessageID string `json:"-"`
	Receipt   string `json:"receipt"`
	Attempt   int    `json:"attempt"`
	Payload   []byte `json:"-"`
}

// httpAPI is the HTTP/JSON API; the workers share one client (and its pool of
// keep-alive connections).
type httpAPI struct {
	cfg    Config
	client *http.Client
}

// httpAPIs makes the workers' httpAPIs, all over client.
func httpAPIs(cfg Config, client *http.Client) func() (api, error) {
	return func() (api, error) { return &httpAPI{cfg: cfg, client: client}, nil }
}

func (h *httpAPI) Close() error { return nil }

func (h *httpAPI) receive(ctx context.Context, consumer string) ([]receivedMessage, error) {
	body := map[string]any{
		"max_messages":  h.cfg.Batch,
		"wait_seconds":  int(h.cfg.Wait / time.Second),
		"lease_seconds": int(h.cfg.Lease / time.Second),
		"consumer_id":   consumer,
	}
	raw, err := h.post(ctx, "receive", body)
	if err != nil {
		return nil, err
	}
	return parseReceive(raw)
}

func (h *httpAPI) ack(ctx context.Context, receipts []string) (int64, int64, error) {
	raw, err := h.post(ctx, "ack", map[string]any{"receipts": receipts})
	if err != nil {
		return 0, 0, err
	}
	return parseAck(raw)
}

// parseReceive reads the receipts (and attempts) of a receive response. It
// accepts `{"messages": [...]}` and a bare array, the two shapes the API's
// description has used; only the receipt is needed.
func parseReceive(raw []byte) ([]receivedMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	var msgs []receivedMessage
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &msgs); err != nil {
			return nil, fmt.Errorf("receive response: %w", err)
		}
	} else {
		var wrapped struct {
			Messages *[]receivedMessage `json:"messages"`
		}
		if err := json.Unmarshal(trimmed, &wrapped); err != nil {
			return nil, fmt.Errorf("receive response: %w", err)
		}
		if wrapped.Messages == nil {
			return nil, fmt.Errorf("receive response has no \"messages\": %.200s", trimmed)
		}
		msgs = *wrapped.Messages
	}
	for _, m := range msgs {
		if m.Receipt == "" {
			return nil, fmt.Errorf("receive response has a message without a receipt: %.200s", trimmed)
		}
	}
	return msgs, nil
}

// parseAck counts the results of an ack response: status "ok" and the rest.
func parseAck(raw []byte) (ok, notOK int64, err error) {
	var resp struct {
		Results *[]struct {
			Status string `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return 0, 0, fmt.Errorf("ack response: %w", err)
	}
	if resp.Results == nil {
		return 0, 0, fmt.Errorf("ack response has no \"results\": %.200s", raw)
	}
	for _, res := range *resp.Results {
		if strings.EqualFold(res.Status, "ok") {
			ok++
		} else {
			notOK++
		}
	}
	return ok, notOK, nil
}

// maxResponseBytes bounds what one response may hold: 100 messages of 1 MiB
// would be the API's ceiling, and no benchmark uses payloads that large.
const maxResponseBytes = 128 << 20

func (h *httpAPI) post(ctx context.Context, op string, body any) ([]byte, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	u := strings.TrimRight(h.cfg.BaseURL, "/") + "/queues/" + url.PathEscape(h.cfg.Queue) + "/" + op
	// A receive may wait up to wait_seconds; anything much longer is a hung request.
	reqCtx, cancel := context.WithTimeout(ctx, h.cfg.Wait+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, u, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s: HTTP %d: %.200s", op, resp.StatusCode, raw)
	}
	return raw, nil
}
