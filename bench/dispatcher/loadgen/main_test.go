package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeQueue serves the receive/ack contract over a fixed set of messages:
// each is leased once (no expiry), and an ack of a receipt not leased, or
// acked before, answers "stale". It records every ack so the test can check
// that the load generator acked each message exactly once, and the most
// messages any one consumer held leased at once.
type fakeQueue struct {
	mu        sync.Mutex
	next      int
	total     int
	leased    map[string]bool
	acked     map[string]int
	consumers map[string]bool
	bareArray bool // answer receives with a bare array instead of {"messages": ...}
	failAcks  int  // the first failAcks acks answer HTTP 503
	ackDelay  time.Duration
	holder    map[string]string // receipt -> consumer, while leased
	held      map[string]int    // consumer -> messages leased and not acked
	maxHeld   int
}

func newFakeQueue(total int) *fakeQueue {
	return &fakeQueue{total: total, leased: map[string]bool{}, acked: map[string]int{}, consumers: map[string]bool{},
		holder: map[string]string{}, held: map[string]int{}}
}

func (q *fakeQueue) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.URL.Path == "/queues/bench/ack" {
		time.Sleep(q.ackDelay)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch r.URL.Path {
	case "/queues/bench/receive":
		limit := int(body["max_messages"].(float64))
		id, _ := body["consumer_id"].(string)
		if id != "" {
			q.consumers[id] = true
		}
		msgs := []map[string]any{}
		for len(msgs) < limit && q.next < q.total {
			receipt := fmt.Sprintf("r-%d", q.next)
			q.leased[receipt] = true
			q.holder[receipt] = id
			q.held[id]++
			q.maxHeld = max(q.maxHeld, q.held[id])
			msgs = append(msgs, map[string]any{"message_id": fmt.Sprint(q.next), "receipt": receipt, "attempt": 1})
			q.next++
		}
		if q.bareArray {
			_ = json.NewEncoder(w).Encode(msgs)
		} else {
			_ = json.NewEncoder(w).Encode(map[string]any{"messages": msgs})
		}
	case "/queues/bench/ack":
		if q.failAcks > 0 {
			q.failAcks--
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		results := []map[string]any{}
		for _, rc := range body["receipts"].([]any) {
			receipt := rc.(string)
			status := "stale"
			if q.leased[receipt] {
				delete(q.leased, receipt)
				q.held[q.holder[receipt]]--
				status = "ok"
			}
			q.acked[receipt]++
			results = append(results, map[string]any{"receipt": receipt, "status": status})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	default:
		http.NotFound(w, r)
	}
}

func testConfig(url string, messages int64) Config {
	return Config{BaseURL: url, Queue: "bench", Workers: 4, Messages: messages, Batch: 7,
		Wait: time.Second, Lease: 60 * time.Second, Timeout: 20 * time.Second, MaxErrors: 5}
}

func TestEveryMessageIsAckedOnceAndCounted(t *testing.T) {
	for _, bare := range []bool{false, true} {
		q := newFakeQueue(1000)
		q.bareArray = bare
		srv := httptest.NewServer(q)
		res := runHTTP(testConfig(srv.URL, 1000), 4)
		srv.Close()
		if res.Status != "ok" || res.Acked != 1000 || res.Counted != 1000 || res.Failed != 0 {
			t.Fatalf("bare=%v: %+v", bare, res)
		}
		for i := 0; i < 1000; i++ {
			if n := q.acked[fmt.Sprintf("r-%d", i)]; n != 1 {
				t.Fatalf("bare=%v: message %d acked %d times", bare, i, n)
			}
		}
		if len(q.consumers) != 4 || !q.consumers["w0"] || !q.consumers["w3"] {
			t.Fatalf("consumer ids seen: %v", q.consumers)
		}
		if int(res.Cycles) != len(res.LatenciesSorted) || res.Cycles < 1000/7 {
			t.Fatalf("cycles %d, latency samples %d", res.Cycles, len(res.LatenciesSorted))
		}
	}
}

func TestPrefetchingWorkersAckEveryMessageOnce(t *testing.T) {
	for _, prefetch := range []bool{false, true} {
		q := newFakeQueue(1000)
		// Slow acks: a prefetching worker's next receive lands before its ack.
		q.ackDelay = 2 * time.Millisecond
		srv := httptest.NewServer(q)
		cfg := testConfig(srv.URL, 1000)
		cfg.Prefetch = prefetch
		res := runHTTP(cfg, 4)
		srv.Close()
		if res.Status != "ok" || res.Acked != 1000 || res.Counted != 1000 || res.Failed != 0 || res.Errors != 0 {
			t.Fatalf("prefetch=%v: %+v", prefetch, res)
		}
		q.mu.Lock()
		for i := 0; i < 1000; i++ {
			if n := q.acked[fmt.Sprintf("r-%d", i)]; n != 1 {
				t.Fatalf("prefetch=%v: message %d acked %d times", prefetch, i, n)
			}
		}
		// One batch held at a time without prefetch; two at most with it.
		want := cfg.Batch
		if prefetch {
			want = 2 * cfg.Batch
		}
		if q.maxHeld != want {
			t.Fatalf("prefetch=%v: a consumer held up to %d messages, want %d", prefetch, q.maxHeld, want)
		}
		q.mu.Unlock()
	}
	cfg := testConfig("", 1000)
	cfg.Prefetch = true
	if line := (Result{}).Line(cfg); !strings.Contains(line, "commit=ack-prefetch") {
		t.Fatalf("%s", line)
	}
}

func TestStopsAtTheTargetCount(t *testing.T) {
	q := newFakeQueue(100000)
	srv := httptest.NewServer(q)
	defer srv.Close()
	res := runHTTP(testConfig(srv.URL, 500), 4)
	// The last cycles of the other workers may land after the 500th ack, one
	// batch each at most.
	if res.Status != "ok" || res.Counted != 500 || res.Acked < 500 || res.Acked > 500+4*7 {
		t.Fatalf("%+v", res)
	}
}

func TestTransientErrorsAreRetriedAndCounted(t *testing.T) {
	q := newFakeQueue(200)
	q.failAcks = 3
	srv := httptest.NewServer(q)
	defer srv.Close()
	cfg := testConfig(srv.URL, 200-3*7)
	cfg.Workers = 1
	res := runHTTP(cfg, 1)
	if res.Status != "ok" || res.Errors != 3 || !strings.Contains(res.LastError, "HTTP 503") {
		t.Fatalf("%+v", res)
	}
}

func TestGivesUpAfterConsecutiveErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer srv.Close()
	res := runHTTP(testConfig(srv.URL, 10), 4)
	if res.Status != "error" || res.Acked != 0 || res.Errors < 5 {
		t.Fatalf("%+v", res)
	}
}

func TestTimesOutWhenMessagesRunShort(t *testing.T) {
	q := newFakeQueue(50)
	srv := httptest.NewServer(q)
	defer srv.Close()
	cfg := testConfig(srv.URL, 100)
	cfg.Timeout = 1500 * time.Millisecond
	res := runHTTP(cfg, 4)
	if res.Status != "timeout" || res.Acked != 50 || res.Counted != 50 {
		t.Fatalf("%+v", res)
	}
	if !strings.Contains(res.Line(cfg), "status=timeout") {
		t.Fatalf("%s", res.Line(cfg))
	}
}

func TestParseRejectsResponsesWithoutReceiptsOrResults(t *testing.T) {
	for _, raw := range []string{`{}`, `{"messages": [{"message_id": "a"}]}`, `not json`} {
		if _, err := parseReceive([]byte(raw)); err == nil {
			t.Errorf("parseReceive(%s) accepted", raw)
		}
	}
	if _, _, err := parseAck([]byte(`{"result": []}`)); err == nil {
		t.Error("parseAck accepted a response without results")
	}
	ok, notOK, err := parseAck([]byte(`{"results": [{"receipt": "a", "status": "ok"}, {"receipt": "b", "status": "stale"}]}`))
	if err != nil || ok != 1 || notOK != 1 {
		t.Errorf("parseAck: %d %d %v", ok, notOK, err)
	}
}

func runHTTP(cfg Config, workers int) Result {
	return Run(context.Background(), cfg, httpAPIs(cfg, newClient(workers)))
}
