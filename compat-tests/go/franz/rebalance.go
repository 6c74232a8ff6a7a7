package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	sc "compat-tests/go/internal/scenario"
)

const (
	rebalancePartitions = 6
	// Records per produce phase; phase 2 starts only after the membership change.
	phaseRecords = 3000
	// Produce rate of each phase: 3000 records take about 6 s, so the change lands mid-stream.
	recordsPerSecond = 500
	// The change waits for a stable 3-member assignment and this many processed records.
	changeAfterRecords = 1000
	stableWait         = 30 * time.Second
	drainWait          = 25 * time.Second
)

// tracker is what the group did to the topic: per partition the highest
// committed offset (taken when a synchronous commit returned) and every
// processed offset. A delivery below the committed offset of its moment is a
// violation; one at or above it that was processed before is a duplicate.
type tracker struct {
	mu             sync.Mutex
	committed      [rebalancePartitions]int64
	processed      [rebalancePartitions]map[int64]bool
	unique         int
	duplicates     int
	commitFailures int
	violations     []string
	errs           []string
}

func newTracker() *tracker {
	t := &tracker{}
	for p := range t.processed {
		t.processed[p] = map[int64]bool{}
	}
	return t
}

func (t *tracker) deliver(member string, p int32, offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset < t.committed[p] && len(t.violations) < 5 {
		t.violations = append(t.violations, fmt.Sprintf("%s got partition %d offset %d below the committed %d", member, p, offset, t.committed[p]))
	}
	if t.processed[p][offset] {
		t.duplicates++
	} else {
		t.processed[p][offset] = true
		t.unique++
	}
}

func (t *tracker) snapshot() (unique int, committed [rebalancePartitions]int64, errs []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unique, t.committed, append([]string(nil), t.errs...)
}

// member is one group member with its own client on its own goroutine. It
// polls with BlockRebalanceOnPoll, processes (records each delivery), commits
// synchronously and only then allows a rebalance, so nothing it processed is
// handed to another member uncommitted unless the commit was refused.
type member struct {
	name      string
	cl        *kgo.Client
	mu        sync.Mutex
	owned     map[int32]bool
	processed atomic.Int64
	stop      atomic.Bool
	done      chan struct{}
}

func (m *member) ownedSet() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int32, 0, len(m.owned))
	for p := range m.owned {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func startMember(env *sc.Env, name, topic, group string, t *tracker) (*member, error) {
	m := &member{name: name, owned: map[int32]bool{}, done: make(chan struct{})}
	change := func(add bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, p := range ps[topic] {
				if add {
					m.owned[p] = true
				} else {
					delete(m.owned, p)
				}
			}
		}
	}
	cl, err := newClient(env,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(change(true)),
		kgo.OnPartitionsRevoked(change(false)),
		kgo.OnPartitionsLost(change(false)),
	)
	if err != nil {
		return nil, err
	}
	m.cl = cl
	go m.run(topic, t)
	return m, nil
}

func (m *member) run(topic string, t *tracker) {
	defer close(m.done)
	defer m.cl.Close() // LeaveGroup
	pending := map[int32]*kgo.Record{}
	for !m.stop.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := m.cl.PollRecords(ctx, 100)
		cancel()
		var fetchErr error
		fs.EachError(func(tp string, p int32, err error) {
			if fetchErr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				fetchErr = fmt.Errorf("Fetch %s[%d]: %w", tp, p, err)
			}
		})
		if fetchErr != nil {
			t.mu.Lock()
			t.errs = append(t.errs, m.name+": "+fetchErr.Error())
			t.mu.Unlock()
			m.cl.AllowRebalance()
			return
		}
		fs.EachRecord(func(r *kgo.Record) {
			t.deliver(m.name, r.Partition, r.Offset)
			m.processed.Add(1)
			pending[r.Partition] = r
		})
		// A refused commit stays pending and is retried after the next poll,
		// for the partitions this member still owns.
		m.mu.Lock()
		var toCommit []*kgo.Record
		for p, r := range pending {
			if m.owned[p] {
				toCommit = append(toCommit, r)
			} else {
				delete(pending, p)
			}
		}
		m.mu.Unlock()
		if len(toCommit) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := m.cl.CommitRecords(ctx, toCommit...)
			cancel()
			t.mu.Lock()
			if err != nil {
				t.commitFailures++
				sc.Logf("franz: member %s: commit failed: %v", m.name, err)
			} else {
				for _, r := range toCommit {
					if r.Offset+1 > t.committed[r.Partition] {
						t.committed[r.Partition] = r.Offset + 1
					}
				}
				pending = map[int32]*kgo.Record{}
			}
			t.mu.Unlock()
		}
		m.cl.AllowRebalance()
	}
}

func (m *member) stopAndWait() error {
	m.stop.Store(true)
	select {
	case <-m.done:
		return nil
	case <-time.After(20 * time.Second):
		return fmt.Errorf("member %s did not close within 20 s (LeaveGroup)", m.name)
	}
}

func fullyAssigned(ms []*member) bool {
	seen := map[int32]bool{}
	total := 0
	for _, m := range ms {
		owned := m.ownedSet()
		if len(owned) == 0 {
			return false
		}
		for _, p := range owned {
			seen[p] = true
		}
		total += len(owned)
	}
	return len(seen) == rebalancePartitions && total == rebalancePartitions
}

func assignments(ms []*member) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%s=%v", m.name, m.ownedSet())
	}
	return strings.Join(parts, " ")
}

func await(ctx context.Context, t *tracker, bound time.Duration, what func() string, done func() bool) error {
	deadline := time.Now().Add(bound)
	for !done() {
		if _, _, errs := t.snapshot(); len(errs) > 0 {
			return errors.New(strings.Join(errs, "; "))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s (waited %s)", what(), bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// producePhase produces records from..from+n-1 at recordsPerSecond and waits
// for every acknowledgement, raising logEnd to each acked offset + 1.
func producePhase(ctx context.Context, cl *kgo.Client, topic string, from, n int, logEnd *[rebalancePartitions]int64, mu *sync.Mutex) error {
	var wg sync.WaitGroup
	var firstErr atomic.Value
	began := time.Now()
	for i := from; i < from+n; i++ {
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%d", i)), Value: []byte(fmt.Sprintf("rebalance-%d", i))},
			func(r *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				mu.Lock()
				if r.Offset+1 > logEnd[r.Partition] {
					logEnd[r.Partition] = r.Offset + 1
				}
				mu.Unlock()
			})
		if wait := time.Until(began.Add(time.Duration(i-from+1) * time.Second / recordsPerSecond)); wait > 0 {
			time.Sleep(wait)
		}
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return fmt.Errorf("Produce: %w", err)
	}
	return nil
}

// groupRebalance: 3 members consume a keyed stream from a 6-partition topic;
// mid-stream one leaves and one joins; everything is processed, nothing below
// a committed offset comes again, and the committed offsets end at the log end.
func groupRebalance(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("group.rebalance")
	group := topic + "-group"
	cl, err := newClient(env)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, rebalancePartitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	if err := awaitPartitionsReady(ctx, adm, topic, rebalancePartitions); err != nil {
		return "", err
	}
	t := newTracker()
	var logEnd [rebalancePartitions]int64
	var logEndMu sync.Mutex
	var all []*member
	defer func() {
		for _, m := range all {
			m.stop.Store(true)
		}
	}()
	phase1 := make(chan error, 1)
	go func() { phase1 <- producePhase(ctx, cl, topic, 0, phaseRecords, &logEnd, &logEndMu) }()
	for _, name := range []string{"m1", "m2", "m3"} {
		m, err := startMember(env, name, topic, group, t)
		if err != nil {
			return "", err
		}
		all = append(all, m)
	}
	first := append([]*member(nil), all...)
	if err := await(ctx, t, stableWait, func() string {
		u, _, _ := t.snapshot()
		return fmt.Sprintf("3 members never held all %d partitions while processing (%s, %d processed)", rebalancePartitions, assignments(first), u)
	}, func() bool {
		u, _, _ := t.snapshot()
		return fullyAssigned(first) && u >= changeAfterRecords
	}); err != nil {
		return "", fmt.Errorf("%s; %w", diagnoseCoordinator(cl, group), err)
	}
	before := assignments(first)
	processedBefore, _, _ := t.snapshot()
	// Mid-stream: m1 leaves (closes) and m4 joins.
	if err := first[0].stopAndWait(); err != nil {
		return "", err
	}
	m4, err := startMember(env, "m4", topic, group, t)
	if err != nil {
		return "", err
	}
	all = append(all, m4)
	after := []*member{first[1], first[2], m4}
	if err := await(ctx, t, stableWait, func() string {
		return "after m1 left and m4 joined the members never held all partitions (" + assignments(after) + ")"
	}, func() bool { return fullyAssigned(after) }); err != nil {
		return "", err
	}
	afterText := assignments(after)
	if err := <-phase1; err != nil {
		return "", fmt.Errorf("phase 1: %w", err)
	}
	if err := producePhase(ctx, cl, topic, phaseRecords, phaseRecords, &logEnd, &logEndMu); err != nil {
		return "", fmt.Errorf("phase 2: %w", err)
	}
	total := 2 * phaseRecords
	if err := await(ctx, t, drainWait, func() string {
		u, _, _ := t.snapshot()
		return fmt.Sprintf("processed %d of %d records", u, total)
	}, func() bool { u, _, _ := t.snapshot(); return u >= total }); err != nil {
		return "", err
	}
	logEndMu.Lock()
	end := logEnd
	logEndMu.Unlock()
	if err := await(ctx, t, drainWait, func() string {
		_, c, _ := t.snapshot()
		return fmt.Sprintf("committed offsets %v never reached the log end offsets %v", c, end)
	}, func() bool { _, c, _ := t.snapshot(); return c == end }); err != nil {
		return "", err
	}
	for _, m := range after {
		if err := m.stopAndWait(); err != nil {
			return "", err
		}
	}
	t.mu.Lock()
	violations, duplicates, refused := t.violations, t.duplicates, t.commitFailures
	for p := 0; p < rebalancePartitions; p++ {
		for o := int64(0); o < end[p]; o++ {
			if !t.processed[p][o] {
				t.mu.Unlock()
				return "", fmt.Errorf("partition %d offset %d never processed (log end %d)", p, o, end[p])
			}
		}
	}
	t.mu.Unlock()
	if len(violations) > 0 {
		return "", fmt.Errorf("redelivered below the committed offset: %s", strings.Join(violations, "; "))
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return "", fmt.Errorf("OffsetFetch: %w", err)
	}
	for p := int32(0); p < rebalancePartitions; p++ {
		if o, ok := committed.Lookup(topic, p); !ok || o.Err != nil || o.At != end[p] {
			return "", fmt.Errorf("OffsetFetch partition %d: committed %+v, log end %d", p, o, end[p])
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	if _, err := adm.DeleteGroup(dctx, group); err != nil {
		sc.Logf("franz: deleting group %s: %v", group, err)
	}
	return fmt.Sprintf("%d records all processed (%d before the change), %d duplicates above the last commit, %d refused commits, 0 below a commit; "+
		"default balancer (cooperative-sticky), BlockRebalanceOnPoll + CommitRecords after every poll; before %s; after %s; m4 processed %d; committed = log end %v",
		total, processedBefore, duplicates, refused, before, afterText, m4.processed.Load(), end), nil
}

// awaitPartitionsReady waits until ListOffsets answers for every partition of
// a new topic: right after CreateTopics Kafka answers NOT_LEADER_OR_FOLLOWER for
// a moment, and producing into that window made the Java idempotent producer
// stall on a loaded machine.
func awaitPartitionsReady(ctx context.Context, adm *kadm.Client, topic string, partitions int32) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		listed, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			ready := int32(0)
			listed.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					ready++
				} else {
					err = o.Err
				}
			})
			if ready == partitions {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ListOffsets on the new topic %s: %d partitions not ready: %v", topic, partitions, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
