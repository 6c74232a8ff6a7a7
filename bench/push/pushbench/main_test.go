package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDispatcher is the dispatcher API pushbench uses: pause, produce,
// resume (which pushes every message to the endpoint, some twice), stats.
type fakeDispatcher struct {
	endpoint string
	mu       sync.Mutex
	paused   bool
	ids      []string
	acked    int
	twice    bool // push every tenth message a second time
}

func (f *fakeDispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method + " " + r.URL.Path {
	case "POST /queues/bench/pause":
		f.mu.Lock()
		f.paused = true
		f.mu.Unlock()
	case "POST /queues/bench/resume":
		f.mu.Lock()
		f.paused = false
		ids := append([]string(nil), f.ids...)
		f.mu.Unlock()
		go f.push(ids)
	case "POST /queues/bench/messages":
		var body struct {
			Messages []struct {
				Payload string `json:"payload"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		for _, m := range body.Messages {
			if len(m.Payload) != 100 {
				http.Error(w, "payload size", 400)
				return
			}
		}
		f.mu.Lock()
		if !f.paused {
			f.mu.Unlock()
			http.Error(w, "produce before pause", 409)
			return
		}
		var results []map[string]any
		for range body.Messages {
			id := fmt.Sprintf("id-%d", len(f.ids))
			f.ids = append(f.ids, id)
			results = append(results, map[string]any{"message_id": id, "status": "accepted"})
		}
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	case "GET /queues/bench":
		f.mu.Lock()
		depth := len(f.ids) - f.acked
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"depth": depth, "in_flight": 0})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeDispatcher) push(ids []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, id := range ids {
		times := 1
		if f.twice && i%10 == 0 {
			times = 2
		}
		for range times {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				req, _ := http.NewRequest(http.MethodPost, f.endpoint, strings.NewReader("payload"))
				req.Header.Set("Dispatcher-Message-Id", id)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		f.mu.Lock()
		f.acked++
		f.mu.Unlock()
	}
}

func TestEveryMessageIsCountedOnceAndTheQueueDrains(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeDispatcher{endpoint: "http://" + lis.Addr().String() + "/push", twice: true}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	cfg := Config{Dispatcher: srv.URL, Queue: "bench", Delay: time.Millisecond, Messages: 1200, Size: 100,
		Concurrency: 4, Timeout: 20 * time.Second}
	res := Run(context.Background(), cfg, lis)
	if res.Status != "ok" || res.Answered != 1200 || res.Requests != 1320 || res.Elapsed <= 0 || res.AllAcked < res.Elapsed {
		t.Fatalf("status=%s err=%s answered=%d requests=%d elapsed=%v all_acked=%v",
			res.Status, res.Err, res.Answered, res.Requests, res.Elapsed, res.AllAcked)
	}
	line := res.Line(cfg)
	for _, want := range []string{"status=ok", "messages=1200", "duplicates=120", "littles_law_bound=4000"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
}

func TestAPushWhileProducingIsAnError(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A dispatcher that ignores pause: it pushes each produce at once.
	ignoring := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/queues/bench/messages":
			req, _ := http.NewRequest(http.MethodPost, "http://"+lis.Addr().String(), nil)
			req.Header.Set("Dispatcher-Message-Id", "early")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"results": []map[string]any{{"status": "accepted"}}})
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	srv := httptest.NewServer(ignoring)
	defer srv.Close()
	cfg := Config{Dispatcher: srv.URL, Queue: "bench", Messages: 1, Size: 10, Timeout: 5 * time.Second}
	res := Run(context.Background(), cfg, lis)
	if res.Status != "error" || !strings.Contains(res.Err, "while the queue was paused") {
		t.Fatalf("status=%s err=%s", res.Status, res.Err)
	}
}
