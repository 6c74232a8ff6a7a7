// Command sarama runs the compat scenarios with github.com/IBM/sarama:
//
//	sarama <bootstrap> [scenario-id ...]
//
// config.Version is sarama.MaxVersion (Kafka 4.3.1 for the pinned sarama), so
// sarama picks modern request versions and negotiates them down to what the
// broker's ApiVersions response advertises.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/IBM/sarama"

	sc "compat-tests/go/internal/scenario"
)

func main() {
	if os.Getenv("COMPAT_DEBUG") != "" {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
	}
	sc.Main("sarama", map[string]sc.Func{
		"admin.topics":         adminTopics,
		"codec.none":           codec(sarama.CompressionNone, "none"),
		"codec.gzip":           codec(sarama.CompressionGZIP, "gzip"),
		"codec.snappy":         codec(sarama.CompressionSnappy, "snappy"),
		"codec.lz4":            codec(sarama.CompressionLZ4, "lz4"),
		"codec.zstd":           codec(sarama.CompressionZSTD, "zstd"),
		"idempotent":           idempotent,
		"group.commit":         groupCommit,
		"seek.earliest":        seekEarliest,
		"seek.latest":          seekLatest,
		"seek.timestamp":       seekTimestamp,
		"large.near_max":       largeNearMax,
		"large.above_max":      largeAboveMax,
		"partitions.many":      partitionsMany,
		"unknown.autocreate":   unknownAutocreate,
		"unknown.noautocreate": unknownNoAutocreate,
	})
}

// newConfig is the configuration every scenario starts from: acks=all,
// explicit partitions, errors returned, client-side auto-creation off, and
// time-outs short enough that a silent broker fails inside the scenario bound.
func newConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.MaxVersion
	c.ClientID = "compat-sarama"
	c.Net.DialTimeout = 10 * time.Second
	c.Net.ReadTimeout = 20 * time.Second
	c.Net.WriteTimeout = 10 * time.Second
	c.Metadata.AllowAutoTopicCreation = false
	c.Metadata.Retry.Max = 10
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	// Kafka answers NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION for
	// a few seconds after creating many partitions (or auto-creating one):
	// retry for up to ~15 s, inside the scenario bound.
	c.Producer.Retry.Max = 60
	c.Producer.Retry.Backoff = 250 * time.Millisecond
	c.Consumer.Return.Errors = true
	return c
}

// session owns the clients a scenario opens and closes them all at the end.
type session struct {
	env     *sc.Env
	closers []func() error
}

func (s *session) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil {
			sc.Logf("sarama: close: %v", err)
		}
	}
}

func (s *session) client(cfg *sarama.Config) (sarama.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sarama config: %w", err)
	}
	cl, err := sarama.NewClient([]string{s.env.Bootstrap}, cfg)
	if err != nil {
		return nil, fmt.Errorf("NewClient: %w", err)
	}
	s.closers = append(s.closers, cl.Close)
	return cl, nil
}

// admin returns a cluster admin on a client of its own (closing an admin
// closes its client).
func (s *session) admin() (sarama.ClusterAdmin, error) {
	cl, err := sarama.NewClient([]string{s.env.Bootstrap}, newConfig())
	if err != nil {
		return nil, fmt.Errorf("NewClient: %w", err)
	}
	adm, err := sarama.NewClusterAdminFromClient(cl)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("NewClusterAdmin: %w", err)
	}
	s.closers = append(s.closers, adm.Close)
	return adm, nil
}

func (s *session) producer(cfg *sarama.Config) (sarama.SyncProducer, error) {
	cl, err := s.client(cfg)
	if err != nil {
		return nil, err
	}
	p, err := sarama.NewSyncProducerFromClient(cl)
	if err != nil {
		return nil, fmt.Errorf("NewSyncProducer: %w", err)
	}
	s.closers = append(s.closers, p.Close)
	return p, nil
}

func (s *session) consumer(cfg *sarama.Config) (sarama.Consumer, error) {
	cl, err := s.client(cfg)
	if err != nil {
		return nil, err
	}
	c, err := sarama.NewConsumerFromClient(cl)
	if err != nil {
		return nil, fmt.Errorf("NewConsumer: %w", err)
	}
	s.closers = append(s.closers, c.Close)
	return c, nil
}

// createTopic creates a topic and waits until the metadata shows every
// partition with a leader.
func createTopic(ctx context.Context, adm sarama.ClusterAdmin, topic string, partitions int32, configs map[string]*string) error {
	err := adm.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs}, false)
	if err != nil {
		return fmt.Errorf("CreateTopics %s: %w", topic, err)
	}
	for {
		md, err := adm.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError && len(md[0].Partitions) == int(partitions) {
			leaders := 0
			for _, p := range md[0].Partitions {
				if p.Err == sarama.ErrNoError && p.Leader >= 0 {
					leaders++
				}
			}
			if leaders == int(partitions) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Metadata: %s not ready with %d partitions led (last error %v)", topic, partitions, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func deleteTopic(adm sarama.ClusterAdmin, topic string) {
	if err := adm.DeleteTopic(topic); err != nil {
		sc.Logf("sarama: deleting %s: %v", topic, err)
	}
}

func toSarama(topic string, r sc.Record) *sarama.ProducerMessage {
	hs := make([]sarama.RecordHeader, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
	}
	return &sarama.ProducerMessage{
		Topic:     topic,
		Partition: r.Partition,
		Key:       sarama.ByteEncoder(r.Key),
		Value:     sarama.ByteEncoder(r.Value),
		Headers:   hs,
		Timestamp: time.UnixMilli(r.TimestampMs),
	}
}

func fromSarama(m *sarama.ConsumerMessage) sc.Record {
	hs := make([]sc.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = sc.Header{Key: string(h.Key), Value: h.Value}
	}
	return sc.Record{
		Partition:   m.Partition,
		Offset:      m.Offset,
		Key:         m.Key,
		Value:       m.Value,
		Headers:     hs,
		TimestampMs: m.Timestamp.UnixMilli(),
	}
}

func produce(p sarama.SyncProducer, topic string, recs []sc.Record) error {
	msgs := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		msgs[i] = toSarama(topic, r)
	}
	if err := p.SendMessages(msgs); err != nil {
		var perrs sarama.ProducerErrors
		if errors.As(err, &perrs) && len(perrs) > 0 {
			return fmt.Errorf("Produce: %d of %d failed, first: %w", len(perrs), len(msgs), perrs[0].Err)
		}
		return fmt.Errorf("Produce: %w", err)
	}
	return nil
}

// consume reads partitions from the given start offsets until n records
// arrived, the context ends, or a partition consumer reports an error.
func consume(ctx context.Context, c sarama.Consumer, topic string, starts map[int32]int64, n int) ([]sc.Record, error) {
	msgs := make(chan *sarama.ConsumerMessage, n)
	errs := make(chan error, len(starts))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for p, start := range starts {
		pc, err := c.ConsumePartition(topic, p, start)
		if err != nil {
			return nil, fmt.Errorf("ConsumePartition %s[%d]: %w", topic, p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.AsyncClose()
			for {
				select {
				case m := <-pc.Messages():
					select {
					case msgs <- m:
					case <-stop:
						return
					}
				case e := <-pc.Errors():
					select {
					case errs <- fmt.Errorf("Fetch %s[%d]: %w", e.Topic, e.Partition, e.Err):
					default:
					}
				case <-stop:
					return
				}
			}
		}()
	}
	var out []sc.Record
	for len(out) < n {
		select {
		case m := <-msgs:
			out = append(out, fromSarama(m))
		case err := <-errs:
			return out, err
		case <-ctx.Done():
			return out, fmt.Errorf("timeout: consumed %d of %d records", len(out), n)
		}
	}
	return out, nil
}

func fromOldest(partitions int32) map[int32]int64 {
	m := make(map[int32]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		m[p] = sarama.OffsetOldest
	}
	return m
}

func adminTopics(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("admin.topics")
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	retention := "3600000"
	if err := createTopic(ctx, adm, topic, 3, map[string]*string{"retention.ms": &retention}); err != nil {
		return "", err
	}
	md, err := adm.DescribeTopics([]string{topic})
	if err != nil {
		return "", fmt.Errorf("Metadata: %w", err)
	}
	if len(md) != 1 || md[0].Err != sarama.ErrNoError || len(md[0].Partitions) != 3 {
		return "", fmt.Errorf("Metadata: %s described as %+v, want 3 partitions", topic, md)
	}
	entries, err := adm.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms"}})
	if err != nil {
		return "", fmt.Errorf("DescribeConfigs: %w", err)
	}
	var value, source string
	for _, e := range entries {
		if e.Name == "retention.ms" {
			value, source = e.Value, e.Source.String()
		}
	}
	if value != retention {
		return "", fmt.Errorf("DescribeConfigs: retention.ms=%q (source %s), want %s", value, source, retention)
	}
	listed, err := adm.ListTopics()
	if err != nil {
		return "", fmt.Errorf("ListTopics (Metadata+DescribeConfigs): %w", err)
	}
	if d, ok := listed[topic]; !ok || d.NumPartitions != 3 {
		return "", fmt.Errorf("ListTopics: %s missing or with %d partitions among %d topics", topic, d.NumPartitions, len(listed))
	}
	if err := adm.DeleteTopic(topic); err != nil {
		return "", fmt.Errorf("DeleteTopics: %w", err)
	}
	// Deletion is asynchronous on Kafka: the metadata may list the topic for
	// a moment after the DeleteTopics response.
	for {
		listed, err = adm.ListTopics()
		if _, still := listed[topic]; err == nil && !still {
			break
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("ListTopics: %s still listed after DeleteTopics (err %v)", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	md, err = adm.DescribeTopics([]string{topic})
	if err != nil {
		return "", fmt.Errorf("Metadata after delete: %w", err)
	}
	if len(md) == 1 && md[0].Err != sarama.ErrUnknownTopicOrPartition {
		return "", fmt.Errorf("Metadata %s after delete: %v, want UNKNOWN_TOPIC_OR_PARTITION", topic, md[0].Err)
	}
	return fmt.Sprintf("created 3 partitions, retention.ms=%s (%s), listed, deleted, gone", value, source), nil
}

// codec produces CodecCount records without idempotence (the idempotent
// scenario covers that path) and reads them back partition by partition.
func codec(compression sarama.CompressionCodec, name string) sc.Func {
	return func(ctx context.Context, env *sc.Env) (string, error) {
		cfg := newConfig()
		cfg.Producer.Compression = compression
		return roundTrip(ctx, env, "codec."+name, name, cfg)
	}
}

func idempotent(ctx context.Context, env *sc.Env) (string, error) {
	cfg := newConfig()
	cfg.Producer.Idempotent = true
	// sarama requires one request in flight per broker for idempotence.
	cfg.Net.MaxOpenRequests = 1
	return roundTrip(ctx, env, "idempotent", "idem", cfg)
}

func roundTrip(ctx context.Context, env *sc.Env, id, tag string, producerCfg *sarama.Config) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic(id)
	const partitions = 3
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	if err := createTopic(ctx, adm, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	p, err := s.producer(producerCfg)
	if err != nil {
		return "", err
	}
	want := sc.Numbered(sc.CodecCount, partitions, tag, sc.BaseTimestampMs(), 1)
	if err := produce(p, topic, want); err != nil {
		return "", err
	}
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, fromOldest(partitions), len(want))
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(want, got); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d records over %d partitions intact and in order", len(got), partitions), nil
}

// groupHandler hands each claimed message to onMessage until it returns true.
type groupHandler struct {
	onMessage func(sarama.ConsumerGroupSession, *sarama.ConsumerMessage) bool
}

func (groupHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok || h.onMessage(sess, m) {
				return nil
			}
		case <-sess.Context().Done():
			return nil
		}
	}
}

// runMember joins the group and consumes through handler until done is
// closed or the context ends; it returns the first error the group reports.
func runMember(ctx context.Context, s *session, group, topic string, done <-chan struct{}, h groupHandler) error {
	cfg := newConfig()
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cl, err := s.client(cfg)
	if err != nil {
		return err
	}
	cg, err := sarama.NewConsumerGroupFromClient(group, cl)
	if err != nil {
		return fmt.Errorf("NewConsumerGroup: %w", err)
	}
	defer cg.Close() // leaves the group
	memberCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumeErr := make(chan error, 1)
	go func() {
		for memberCtx.Err() == nil {
			if err := cg.Consume(memberCtx, []string{topic}, h); err != nil {
				consumeErr <- err
				return
			}
		}
	}()
	select {
	case <-done:
		return nil
	case err := <-consumeErr:
		return fmt.Errorf("ConsumerGroup.Consume: %w", err)
	case err := <-cg.Errors():
		return fmt.Errorf("consumer group: %w", err)
	case <-ctx.Done():
		return errors.New("timeout waiting for group records")
	}
}

func groupCommit(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("group.commit")
	group := topic + "-group"
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	if err := createTopic(ctx, adm, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	p, err := s.producer(newConfig())
	if err != nil {
		return "", err
	}
	if err := produce(p, topic, sc.Numbered(200, 1, "group", sc.BaseTimestampMs(), 1)); err != nil {
		return "", err
	}

	// sarama may start a new session (and call the handler again) before the
	// member is closed, so the handler ignores everything after its 100th
	// record and the offsets are read under the lock.
	var mu sync.Mutex
	var firstOffsets []int64
	firstDone := make(chan struct{})
	first := groupHandler{onMessage: func(sess sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) bool {
		mu.Lock()
		defer mu.Unlock()
		if len(firstOffsets) == 100 {
			return true
		}
		firstOffsets = append(firstOffsets, m.Offset)
		if len(firstOffsets) < 100 {
			return false
		}
		sess.MarkMessage(m, "") // marks offset 100, the next to read
		sess.Commit()
		close(firstDone)
		return true
	}}
	joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = runMember(joinCtx, s, group, topic, firstDone, first)
	cancel()
	if err != nil {
		return "", fmt.Errorf("%s; first member: %w", diagnoseCoordinator(s, group), err)
	}
	mu.Lock()
	firstRead := append([]int64(nil), firstOffsets...)
	mu.Unlock()
	for i, o := range firstRead {
		if o != int64(i) {
			return "", fmt.Errorf("first member: record %d has offset %d", i, o)
		}
	}
	committed, err := adm.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		return "", fmt.Errorf("OffsetFetch: %w", err)
	}
	if b := committed.GetBlock(topic, 0); b == nil || b.Err != sarama.ErrNoError || b.Offset != 100 {
		return "", fmt.Errorf("OffsetFetch: committed %+v, want offset 100", b)
	}

	var secondOffsets []int64
	secondDone := make(chan struct{})
	second := groupHandler{onMessage: func(_ sarama.ConsumerGroupSession, m *sarama.ConsumerMessage) bool {
		mu.Lock()
		defer mu.Unlock()
		if len(secondOffsets) == 100 {
			return true
		}
		secondOffsets = append(secondOffsets, m.Offset)
		if len(secondOffsets) < 100 {
			return false
		}
		close(secondDone)
		return true
	}}
	if err := runMember(ctx, s, group, topic, secondDone, second); err != nil {
		return "", fmt.Errorf("second member: %w", err)
	}
	mu.Lock()
	secondRead := append([]int64(nil), secondOffsets...)
	mu.Unlock()
	for i, o := range secondRead {
		if o != int64(100+i) {
			return "", fmt.Errorf("second member: record %d has offset %d, want %d (resume at committed 100)", i, o, 100+i)
		}
	}
	if err := adm.DeleteConsumerGroup(group); err != nil {
		sc.Logf("sarama: deleting group %s: %v", group, err)
	}
	return "committed 100, second member resumed at offset 100 and read 100..199", nil
}

// diagnoseCoordinator asks for the group coordinator directly, so a failing
// group scenario names the API and error the broker gives.
func diagnoseCoordinator(s *session, group string) string {
	cfg := newConfig()
	cfg.Metadata.Retry.Max = 0
	cl, err := s.client(cfg)
	if err != nil {
		return err.Error()
	}
	if _, err := cl.Coordinator(group); err != nil {
		// sarama reports UNSUPPORTED_VERSION itself, without sending, when
		// the broker's ApiVersions response lacks the API.
		if errors.Is(err, sarama.ErrUnsupportedVersion) {
			return "FindCoordinator: UNSUPPORTED_VERSION"
		}
		return "FindCoordinator: " + err.Error()
	}
	return "FindCoordinator answered without error"
}

// seekTopic is the 1-partition topic of the seek scenarios: 100 records with
// timestamps T0 + i*1000 ms.
func seekTopic(ctx context.Context, s *session, id string) (sarama.ClusterAdmin, sarama.SyncProducer, string, []sc.Record, error) {
	topic := s.env.Topic(id)
	adm, err := s.admin()
	if err != nil {
		return nil, nil, "", nil, err
	}
	if err := createTopic(ctx, adm, topic, 1, nil); err != nil {
		return nil, nil, "", nil, err
	}
	p, err := s.producer(newConfig())
	if err != nil {
		deleteTopic(adm, topic)
		return nil, nil, "", nil, err
	}
	want := sc.Numbered(100, 1, "seek", sc.BaseTimestampMs(), 1000)
	if err := produce(p, topic, want); err != nil {
		deleteTopic(adm, topic)
		return nil, nil, "", nil, err
	}
	return adm, p, topic, want, nil
}

func seekEarliest(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	adm, _, topic, want, err := seekTopic(ctx, s, "seek.earliest")
	if err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, map[int32]int64{0: sarama.OffsetOldest}, 1)
	if err != nil {
		return "", err
	}
	if got[0].Offset != 0 || string(got[0].Key) != string(want[0].Key) {
		return "", fmt.Errorf("earliest: first record offset %d key %q, want offset 0 key %q", got[0].Offset, got[0].Key, want[0].Key)
	}
	return "first record at offset 0", nil
}

func seekLatest(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	adm, p, topic, want, err := seekTopic(ctx, s, "seek.latest")
	if err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	// ConsumePartition resolves OffsetNewest (ListOffsets) before it
	// returns, so the record produced afterwards lies after the position.
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetNewest)
	if err != nil {
		return "", fmt.Errorf("ConsumePartition(newest): %w", err)
	}
	defer pc.Close()
	fresh := sc.Numbered(101, 1, "seek", want[0].TimestampMs, 1000)[100]
	if err := produce(p, topic, []sc.Record{fresh}); err != nil {
		return "", err
	}
	select {
	case m := <-pc.Messages():
		if m.Offset != 100 || string(m.Key) != string(fresh.Key) {
			return "", fmt.Errorf("latest: first record read is offset %d key %q, want the new record at offset 100", m.Offset, m.Key)
		}
	case e := <-pc.Errors():
		return "", fmt.Errorf("Fetch: %w", e.Err)
	case <-ctx.Done():
		return "", errors.New("timeout: the record produced after seeking to latest was not read")
	}
	return "nothing old read; new record at offset 100 read first", nil
}

func seekTimestamp(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	adm, _, topic, want, err := seekTopic(ctx, s, "seek.timestamp")
	if err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	cl, err := s.client(newConfig())
	if err != nil {
		return "", err
	}
	target := want[50].TimestampMs
	offset, err := cl.GetOffset(topic, 0, target)
	if err != nil {
		return "", fmt.Errorf("ListOffsets(timestamp): %w", err)
	}
	if offset != 50 {
		return "", fmt.Errorf("ListOffsets(timestamp T0+50000): offset %d, want 50", offset)
	}
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, map[int32]int64{0: offset}, 1)
	if err != nil {
		return "", err
	}
	if got[0].Offset != 50 || got[0].TimestampMs != target {
		return "", fmt.Errorf("consume from offset 50: first record offset %d timestamp %d, want 50 / %d", got[0].Offset, got[0].TimestampMs, target)
	}
	return "ListOffsets(T0+50000)=50, consumer started at 50 with that timestamp", nil
}

// largeConfig raises sarama's client-side limits to 2 MiB so the broker's
// limit is the one that decides.
func largeConfig() *sarama.Config {
	cfg := newConfig()
	cfg.Producer.Compression = sarama.CompressionNone
	cfg.Producer.MaxMessageBytes = sc.ClientLimitBytes
	cfg.Producer.Retry.Max = 0
	cfg.Consumer.Fetch.Default = sc.ClientLimitBytes
	return cfg
}

func largeNearMax(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("large.near_max")
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	if err := createTopic(ctx, adm, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	p, err := s.producer(largeConfig())
	if err != nil {
		return "", err
	}
	rec := sc.Record{Key: []byte("large"), Value: sc.Payload(sc.NearMaxValueBytes), TimestampMs: sc.BaseTimestampMs()}
	if err := produce(p, topic, []sc.Record{rec}); err != nil {
		return "", err
	}
	c, err := s.consumer(largeConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, map[int32]int64{0: sarama.OffsetOldest}, 1)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly([]sc.Record{rec}, got); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-byte value produced and consumed intact", len(got[0].Value)), nil
}

func largeAboveMax(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("large.above_max")
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	if err := createTopic(ctx, adm, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	p, err := s.producer(largeConfig())
	if err != nil {
		return "", err
	}
	rec := sc.Record{Key: []byte("too-large"), Value: sc.Payload(sc.AboveMaxValueBytes), TimestampMs: sc.BaseTimestampMs()}
	// sarama's own check (Producer.MaxMessageBytes, 2 MiB here) passes this
	// record, so MESSAGE_TOO_LARGE can only come from the broker.
	err = produce(p, topic, []sc.Record{rec})
	switch {
	case err == nil:
		return "", errors.New("Produce: 1,100,000-byte record acknowledged, want MESSAGE_TOO_LARGE")
	case errors.Is(err, sarama.ErrMessageSizeTooLarge):
		// The rejected batch must not have been appended.
		cl, err := s.client(newConfig())
		if err != nil {
			return "", err
		}
		end, err := cl.GetOffset(topic, 0, sarama.OffsetNewest)
		if err != nil || end != 0 {
			return "", fmt.Errorf("ListOffsets(latest) after MESSAGE_TOO_LARGE: offset %d (%v), want 0", end, err)
		}
		return "Produce rejected: MESSAGE_TOO_LARGE (10); log end offset still 0", nil
	default:
		return "", fmt.Errorf("Produce: %v, want MESSAGE_TOO_LARGE", err)
	}
}

func partitionsMany(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("partitions.many")
	const partitions = 200
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	if err := createTopic(ctx, adm, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	p, err := s.producer(newConfig())
	if err != nil {
		return "", err
	}
	want := sc.Numbered(partitions, partitions, "many", sc.BaseTimestampMs(), 1)
	if err := produce(p, topic, want); err != nil {
		return "", err
	}
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, fromOldest(partitions), partitions)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(want, got); err != nil {
		return "", err
	}
	return "one record in each of 200 partitions read back", nil
}

func unknownAutocreate(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("unknown.autocreate")
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	cfg := newConfig()
	cfg.Metadata.AllowAutoTopicCreation = true
	p, err := s.producer(cfg)
	if err != nil {
		return "", err
	}
	rec := sc.Numbered(1, 1, "auto", sc.BaseTimestampMs(), 1)
	if err := produce(p, topic, rec); err != nil {
		return "", err
	}
	c, err := s.consumer(newConfig())
	if err != nil {
		return "", err
	}
	got, err := consume(ctx, c, topic, map[int32]int64{0: sarama.OffsetOldest}, 1)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(rec, got); err != nil {
		return "", err
	}
	return "produce auto-created the topic; record acked and consumed", nil
}

func unknownNoAutocreate(ctx context.Context, env *sc.Env) (string, error) {
	s := &session{env: env}
	defer s.close()
	topic := env.Topic("unknown.noautocreate")
	cfg := newConfig() // Metadata.AllowAutoTopicCreation = false
	cfg.Metadata.Retry.Max = 2
	cl, err := s.client(cfg)
	if err != nil {
		return "", err
	}
	if _, err := cl.Partitions(topic); !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return "", fmt.Errorf("Metadata %s: %v, want UNKNOWN_TOPIC_OR_PARTITION", topic, err)
	}
	c, err := sarama.NewConsumerFromClient(cl)
	if err != nil {
		return "", fmt.Errorf("NewConsumer: %w", err)
	}
	defer c.Close()
	if _, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest); !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return "", fmt.Errorf("ConsumePartition %s: %v, want UNKNOWN_TOPIC_OR_PARTITION", topic, err)
	}
	adm, err := s.admin()
	if err != nil {
		return "", err
	}
	md, err := adm.DescribeTopics([]string{topic})
	if err != nil {
		return "", fmt.Errorf("Metadata: %w", err)
	}
	if len(md) == 1 && md[0].Err != sarama.ErrUnknownTopicOrPartition {
		deleteTopic(adm, topic)
		return "", fmt.Errorf("topic %s exists (%v) although auto-creation was off", topic, md[0].Err)
	}
	return "Metadata and ConsumePartition: UNKNOWN_TOPIC_OR_PARTITION; topic not created", nil
}
