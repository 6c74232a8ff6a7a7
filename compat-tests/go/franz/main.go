// Command franz runs the compat scenarios with franz-go (pkg/kgo for
// producing and consuming, pkg/kadm for administration):
//
//	franz <bootstrap> [scenario-id ...]
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	sc "compat-tests/go/internal/scenario"
)

func main() {
	sc.Main("franz", map[string]sc.Func{
		"admin.topics":         adminTopics,
		"codec.none":           codec(kgo.NoCompression(), "none"),
		"codec.gzip":           codec(kgo.GzipCompression(), "gzip"),
		"codec.snappy":         codec(kgo.SnappyCompression(), "snappy"),
		"codec.lz4":            codec(kgo.Lz4Compression(), "lz4"),
		"codec.zstd":           codec(kgo.ZstdCompression(), "zstd"),
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
		"group.rebalance":      groupRebalance,
		"txn.commit":           txnCommit,
		"txn.abort":            txnAbort,
		"txn.offsets":          txnOffsets,
	})
}

// newClient builds a client on the bootstrap address with the scenario's
// options; client warnings go to stderr for diagnosis.
func newClient(env *sc.Env, opts ...kgo.Opt) (*kgo.Client, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(env.Bootstrap),
		kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelWarn, func() string { return "[franz] " })),
		// The default 5 s floor between metadata refreshes would make every
		// scenario that waits for a new topic wait 5 s.
		kgo.MetadataMinAge(250 * time.Millisecond),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kgo.NewClient: %w", err)
	}
	return cl, nil
}

// metadata asks the broker directly (bypassing the client's metadata cache)
// for the given topics, or for all topics when none are given, with
// auto-creation off.
func metadata(ctx context.Context, cl *kgo.Client, topics ...string) (map[string]kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	if len(topics) > 0 {
		for _, t := range topics {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
	} else {
		req.Topics = nil // null: all topics
	}
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("Metadata: %w", err)
	}
	out := make(map[string]kmsg.MetadataResponseTopic, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			out[*t.Topic] = t
		}
	}
	return out, nil
}

// createTopic creates a topic and waits until its metadata shows every
// partition with a leader, so the first produce does not race the creation.
func createTopic(ctx context.Context, cl *kgo.Client, topic string, partitions int32, configs map[string]*string) error {
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, configs, topic)
	if err != nil {
		return fmt.Errorf("CreateTopics %s: %w", topic, err)
	}
	if resp.Err != nil {
		return fmt.Errorf("CreateTopics %s: %w %s", topic, resp.Err, resp.ErrMessage)
	}
	for {
		topics, err := metadata(ctx, cl, topic)
		if err == nil {
			d := topics[topic]
			if d.ErrorCode == 0 && len(d.Partitions) == int(partitions) {
				leaders := 0
				for _, p := range d.Partitions {
					if p.ErrorCode == 0 && p.Leader >= 0 {
						leaders++
					}
				}
				if leaders == int(partitions) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Metadata: topic %s not ready with %d partitions led (last error %v)", topic, partitions, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deleteTopic removes a scenario's topic on a context of its own, because the
// scenario's context may have expired; failures are only logged.
func deleteTopic(adm *kadm.Client, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.DeleteTopics(ctx, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		sc.Logf("franz: deleting %s: %v", topic, err)
	}
}

func toKgo(topic string, r sc.Record) *kgo.Record {
	hs := make([]kgo.RecordHeader, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return &kgo.Record{
		Topic:     topic,
		Partition: r.Partition,
		Key:       r.Key,
		Value:     r.Value,
		Headers:   hs,
		Timestamp: time.UnixMilli(r.TimestampMs),
	}
}

func fromKgo(r *kgo.Record) sc.Record {
	hs := make([]sc.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = sc.Header{Key: h.Key, Value: h.Value}
	}
	return sc.Record{
		Partition:   r.Partition,
		Offset:      r.Offset,
		Key:         r.Key,
		Value:       r.Value,
		Headers:     hs,
		TimestampMs: r.Timestamp.UnixMilli(),
	}
}

// produce sends the records and waits for every acknowledgement.
func produce(ctx context.Context, cl *kgo.Client, topic string, recs []sc.Record) error {
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = toKgo(topic, r)
	}
	if err := cl.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		return fmt.Errorf("Produce: %w", err)
	}
	return nil
}

// consume polls until n records arrived, the context ends, or a fetch error
// that is not retryable is reported.
func consume(ctx context.Context, cl *kgo.Client, n int) ([]sc.Record, error) {
	var out []sc.Record
	for len(out) < n {
		fs := cl.PollRecords(ctx, n-len(out))
		var fetchErr error
		fs.EachError(func(t string, p int32, err error) {
			if fetchErr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				fetchErr = fmt.Errorf("Fetch %s[%d]: %w", t, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) { out = append(out, fromKgo(r)) })
		if fetchErr != nil {
			return out, fetchErr
		}
		if ctx.Err() != nil {
			return out, fmt.Errorf("timeout: consumed %d of %d records", len(out), n)
		}
	}
	return out, nil
}

func fromStart(topic string, partitions int32) kgo.Opt {
	ps := map[int32]kgo.Offset{}
	for p := int32(0); p < partitions; p++ {
		ps[p] = kgo.NewOffset().AtStart()
	}
	return kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: ps})
}

func adminTopics(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("admin.topics")
	cl, err := newClient(env)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	retention := "3600000"
	if err := createTopic(ctx, cl, topic, 3, map[string]*string{"retention.ms": &retention}); err != nil {
		return "", err
	}
	details, err := metadata(ctx, cl, topic)
	if err != nil {
		return "", err
	}
	if d := details[topic]; d.ErrorCode != 0 || len(d.Partitions) != 3 {
		return "", fmt.Errorf("Metadata: %s has %d partitions (%v), want 3", topic, len(d.Partitions), kerr.ErrorForCode(d.ErrorCode))
	}
	configs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("DescribeConfigs: %w", err)
	}
	rc, err := configs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return "", fmt.Errorf("DescribeConfigs %s: %v %v", topic, err, rc.Err)
	}
	var value, source string
	for _, c := range rc.Configs {
		if c.Key == "retention.ms" && c.Value != nil {
			value, source = *c.Value, c.Source.String()
		}
	}
	if value != retention {
		return "", fmt.Errorf("DescribeConfigs: retention.ms=%q (source %s), want %s", value, source, retention)
	}
	all, err := metadata(ctx, cl)
	if err != nil {
		return "", err
	}
	if _, ok := all[topic]; !ok {
		return "", fmt.Errorf("Metadata (all topics): %s not listed among %d topics", topic, len(all))
	}
	resp, err := adm.DeleteTopics(ctx, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return "", fmt.Errorf("DeleteTopics: %w", err)
	}
	// Deletion is asynchronous on Kafka: the metadata may list the topic for
	// a moment after the DeleteTopics response.
	for {
		all, err = metadata(ctx, cl)
		if _, listed := all[topic]; err == nil && !listed {
			break
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("Metadata: %s still listed after DeleteTopics (err %v)", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone, err := metadata(ctx, cl, topic)
	if err != nil {
		return "", err
	}
	if d, ok := gone[topic]; ok && d.ErrorCode != kerr.UnknownTopicOrPartition.Code {
		return "", fmt.Errorf("Metadata %s after delete: %v, want UNKNOWN_TOPIC_OR_PARTITION", topic, kerr.ErrorForCode(d.ErrorCode))
	}
	return fmt.Sprintf("created 3 partitions, retention.ms=%s (%s), listed, deleted, gone", value, source), nil
}

// codec produces CodecCount records without idempotence (the idempotent
// scenario covers that path) and reads them back by assignment.
func codec(compression kgo.CompressionCodec, name string) sc.Func {
	return func(ctx context.Context, env *sc.Env) (string, error) {
		return roundTrip(ctx, env, "codec."+name, name, kgo.ProducerBatchCompression(compression), kgo.DisableIdempotentWrite())
	}
}

func idempotent(ctx context.Context, env *sc.Env) (string, error) {
	// franz-go writes idempotently by default; acks=all is what idempotence requires.
	return roundTrip(ctx, env, "idempotent", "idem", kgo.ProducerBatchCompression(kgo.NoCompression()))
}

func roundTrip(ctx context.Context, env *sc.Env, id, tag string, producerOpts ...kgo.Opt) (string, error) {
	topic := env.Topic(id)
	const partitions = 3
	opts := append([]kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}, producerOpts...)
	cl, err := newClient(env, opts...)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	want := sc.Numbered(sc.CodecCount, partitions, tag, sc.BaseTimestampMs(), 1)
	if err := produce(ctx, cl, topic, want); err != nil {
		return "", err
	}
	consumer, err := newClient(env, fromStart(topic, partitions))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, len(want))
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(want, got); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d records over %d partitions intact and in order", len(got), partitions), nil
}

func groupCommit(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("group.commit")
	group := topic + "-group"
	cl, err := newClient(env, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	want := sc.Numbered(200, 1, "group", sc.BaseTimestampMs(), 1)
	if err := produce(ctx, cl, topic, want); err != nil {
		return "", err
	}
	groupOpts := []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}

	first, err := newClient(env, groupOpts...)
	if err != nil {
		return "", err
	}
	// The group must form well within the scenario's bound; on a broker
	// without group support the client retries silently, so the failure
	// names what the coordinator lookup answers.
	joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	var firstRecs []*kgo.Record
	for len(firstRecs) < 100 && joinCtx.Err() == nil {
		fs := first.PollRecords(joinCtx, 100-len(firstRecs))
		var fetchErr error
		fs.EachError(func(t string, p int32, err error) {
			if fetchErr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				fetchErr = err
			}
		})
		if fetchErr != nil {
			cancel()
			first.Close()
			return "", fmt.Errorf("%s; group consume: %w", diagnoseCoordinator(cl, group), fetchErr)
		}
		firstRecs = append(firstRecs, fs.Records()...)
	}
	cancel()
	if len(firstRecs) < 100 {
		first.Close()
		return "", fmt.Errorf("%s; timeout: first group member consumed %d of 100 records", diagnoseCoordinator(cl, group), len(firstRecs))
	}
	for i, r := range firstRecs {
		if r.Offset != int64(i) {
			first.Close()
			return "", fmt.Errorf("first member: record %d has offset %d", i, r.Offset)
		}
	}
	if err := first.CommitRecords(ctx, firstRecs[99]); err != nil {
		first.Close()
		return "", fmt.Errorf("OffsetCommit: %w", err)
	}
	first.Close() // leaves the group
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return "", fmt.Errorf("OffsetFetch: %w", err)
	}
	if o, ok := committed.Lookup(topic, 0); !ok || o.Err != nil || o.At != 100 {
		return "", fmt.Errorf("OffsetFetch: committed %+v, want offset 100", o)
	}

	second, err := newClient(env, groupOpts...)
	if err != nil {
		return "", err
	}
	defer second.Close()
	rest, err := consume(ctx, second, 100)
	if err != nil {
		return "", fmt.Errorf("second member: %w", err)
	}
	for i, r := range rest {
		if r.Offset != int64(100+i) {
			return "", fmt.Errorf("second member: record %d has offset %d, want %d (resume at committed 100)", i, r.Offset, 100+i)
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	second.Close()
	if _, err := adm.DeleteGroup(dctx, group); err != nil {
		sc.Logf("franz: deleting group %s: %v", group, err)
	}
	return "committed 100, second member resumed at offset 100 and read 100..199", nil
}

// diagnoseCoordinator asks FindCoordinator directly, so a failing group
// scenario names the API and error the broker gives.
func diagnoseCoordinator(cl *kgo.Client, group string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// franz-go refuses to send a request whose key the broker's ApiVersions
	// left out ("broker is too old"): say so by name.
	versions, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return "ApiVersions: " + err.Error()
	}
	advertised := false
	for _, k := range versions.ApiKeys {
		if k.ApiKey == int16(kmsg.FindCoordinator) {
			advertised = true
		}
	}
	if !advertised {
		return "FindCoordinator (key 10) not advertised in ApiVersions"
	}
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = group
	req.CoordinatorKeys = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "FindCoordinator: " + err.Error()
	}
	code := resp.ErrorCode
	if len(resp.Coordinators) > 0 {
		code = resp.Coordinators[0].ErrorCode
	}
	if err := kerr.ErrorForCode(code); err != nil {
		return "FindCoordinator: " + err.Error()
	}
	return "FindCoordinator answered without error"
}

// seekTopic is the 1-partition topic of the seek scenarios: 100 records with
// timestamps T0 + i*1000 ms.
func seekTopic(ctx context.Context, env *sc.Env, id string) (*kgo.Client, *kadm.Client, string, []sc.Record, error) {
	topic := env.Topic(id)
	cl, err := newClient(env, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, nil, "", nil, err
	}
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, 1, nil); err != nil {
		cl.Close()
		return nil, nil, "", nil, err
	}
	want := sc.Numbered(100, 1, "seek", sc.BaseTimestampMs(), 1000)
	if err := produce(ctx, cl, topic, want); err != nil {
		deleteTopic(adm, topic)
		cl.Close()
		return nil, nil, "", nil, err
	}
	return cl, adm, topic, want, nil
}

func seekEarliest(ctx context.Context, env *sc.Env) (string, error) {
	cl, adm, topic, want, err := seekTopic(ctx, env, "seek.earliest")
	if err != nil {
		return "", err
	}
	defer cl.Close()
	defer deleteTopic(adm, topic)
	consumer, err := newClient(env, fromStart(topic, 1))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, 1)
	if err != nil {
		return "", err
	}
	if got[0].Offset != 0 || string(got[0].Key) != string(want[0].Key) {
		return "", fmt.Errorf("earliest: first record offset %d key %q, want offset 0 key %q", got[0].Offset, got[0].Key, want[0].Key)
	}
	return "first record at offset 0", nil
}

// fetchWatcher reports when the client has sent its first Fetch request,
// which it does only after resolving the start offset with ListOffsets.
type fetchWatcher struct{ fetched atomic.Bool }

func (w *fetchWatcher) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Fetch) && err == nil {
		w.fetched.Store(true)
	}
}

func seekLatest(ctx context.Context, env *sc.Env) (string, error) {
	cl, adm, topic, want, err := seekTopic(ctx, env, "seek.latest")
	if err != nil {
		return "", err
	}
	defer cl.Close()
	defer deleteTopic(adm, topic)
	watcher := &fetchWatcher{}
	consumer, err := newClient(env, kgo.WithHooks(watcher),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtEnd()}}))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	// Produce the new record only once the consumer's position is fixed at
	// the end, otherwise "latest" could resolve after it and skip it.
	for !watcher.fetched.Load() {
		if ctx.Err() != nil {
			return "", errors.New("timeout: consumer never sent a Fetch after ListOffsets(latest)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	fresh := sc.Numbered(101, 1, "seek", want[0].TimestampMs, 1000)[100]
	if err := produce(ctx, cl, topic, []sc.Record{fresh}); err != nil {
		return "", err
	}
	got, err := consume(ctx, consumer, 1)
	if err != nil {
		return "", err
	}
	if got[0].Offset != 100 || string(got[0].Key) != string(fresh.Key) {
		return "", fmt.Errorf("latest: first record read is offset %d key %q, want the new record at offset 100", got[0].Offset, got[0].Key)
	}
	return "nothing old read; new record at offset 100 read first", nil
}

func seekTimestamp(ctx context.Context, env *sc.Env) (string, error) {
	cl, adm, topic, want, err := seekTopic(ctx, env, "seek.timestamp")
	if err != nil {
		return "", err
	}
	defer cl.Close()
	defer deleteTopic(adm, topic)
	target := want[50].TimestampMs
	listed, err := adm.ListOffsetsAfterMilli(ctx, target, topic)
	if err != nil {
		return "", fmt.Errorf("ListOffsets(timestamp): %w", err)
	}
	lo, ok := listed.Lookup(topic, 0)
	if !ok || lo.Err != nil || lo.Offset != 50 || lo.Timestamp != target {
		return "", fmt.Errorf("ListOffsets(timestamp T0+50000): %+v, want offset 50 with timestamp %d", lo, target)
	}
	consumer, err := newClient(env,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AfterMilli(target)}}))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, 1)
	if err != nil {
		return "", err
	}
	if got[0].Offset != 50 || got[0].TimestampMs != target {
		return "", fmt.Errorf("consume after T0+50000: first record offset %d timestamp %d, want 50 / %d", got[0].Offset, got[0].TimestampMs, target)
	}
	return "ListOffsets(T0+50000) = offset 50 with that timestamp; consumer started at 50", nil
}

func largeClient(env *sc.Env, extra ...kgo.Opt) (*kgo.Client, error) {
	return newClient(env, append([]kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(sc.ClientLimitBytes),
		kgo.FetchMaxBytes(2 * sc.ClientLimitBytes),
		kgo.FetchMaxPartitionBytes(sc.ClientLimitBytes),
	}, extra...)...)
}

func largeNearMax(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("large.near_max")
	cl, err := largeClient(env)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	rec := sc.Record{Key: []byte("large"), Value: sc.Payload(sc.NearMaxValueBytes), TimestampMs: sc.BaseTimestampMs()}
	if err := produce(ctx, cl, topic, []sc.Record{rec}); err != nil {
		return "", err
	}
	consumer, err := largeClient(env, fromStart(topic, 1))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, 1)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly([]sc.Record{rec}, got); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-byte value produced and consumed intact", len(got[0].Value)), nil
}

func largeAboveMax(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("large.above_max")
	cl, err := largeClient(env)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, 1, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	rec := sc.Record{Key: []byte("too-large"), Value: sc.Payload(sc.AboveMaxValueBytes), TimestampMs: sc.BaseTimestampMs()}
	err = produce(ctx, cl, topic, []sc.Record{rec})
	switch {
	case err == nil:
		return "", errors.New("Produce: 1,100,000-byte record acknowledged, want MESSAGE_TOO_LARGE")
	case errors.Is(err, kerr.MessageTooLarge):
		// The rejected batch must not have been appended.
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return "", fmt.Errorf("ListOffsets(latest) after rejection: %w", err)
		}
		if end, ok := ends.Lookup(topic, 0); !ok || end.Err != nil || end.Offset != 0 {
			return "", fmt.Errorf("ListOffsets(latest) after MESSAGE_TOO_LARGE: %+v, want offset 0", end)
		}
		return "Produce rejected: MESSAGE_TOO_LARGE (10); log end offset still 0", nil
	default:
		return "", fmt.Errorf("Produce: %v, want MESSAGE_TOO_LARGE", err)
	}
}

func partitionsMany(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("partitions.many")
	const partitions = 200
	cl, err := newClient(env, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	want := sc.Numbered(partitions, partitions, "many", sc.BaseTimestampMs(), 1)
	if err := produce(ctx, cl, topic, want); err != nil {
		return "", err
	}
	consumer, err := newClient(env, fromStart(topic, partitions))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, partitions)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(want, got); err != nil {
		return "", err
	}
	return "one record in each of 200 partitions read back", nil
}

func unknownAutocreate(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("unknown.autocreate")
	// Kafka creates the topic on the first metadata request but may answer
	// UNKNOWN_TOPIC_OR_PARTITION for a moment; the scenario's deadline, not a
	// retry count, bounds the wait.
	cl, err := newClient(env, kgo.AllowAutoTopicCreation(), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.UnknownTopicRetries(-1))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	defer deleteTopic(adm, topic)
	rec := sc.Numbered(1, 1, "auto", sc.BaseTimestampMs(), 1)
	if err := produce(ctx, cl, topic, rec); err != nil {
		return "", err
	}
	consumer, err := newClient(env, fromStart(topic, 1))
	if err != nil {
		return "", err
	}
	defer consumer.Close()
	got, err := consume(ctx, consumer, 1)
	if err != nil {
		return "", err
	}
	if err := sc.VerifyExactly(rec, got); err != nil {
		return "", err
	}
	return "produce auto-created the topic; record acked and consumed", nil
}

func unknownNoAutocreate(ctx context.Context, env *sc.Env) (string, error) {
	topic := env.Topic("unknown.noautocreate")
	// Without AllowAutoTopicCreation franz-go sends metadata requests with
	// allow_auto_topic_creation=false.
	cl, err := newClient(env)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("Metadata: %w", err)
	}
	d, ok := md.Topics[topic]
	if !ok {
		return "", fmt.Errorf("Metadata: response does not mention %s", topic)
	}
	if !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return "", fmt.Errorf("Metadata %s: err %v with %d partitions, want UNKNOWN_TOPIC_OR_PARTITION", topic, d.Err, len(d.Partitions))
	}
	// A consumer assigned to the missing topic must not create it either.
	consumer, err := newClient(env, fromStart(topic, 1))
	if err != nil {
		return "", err
	}
	pollCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	fs := consumer.PollFetches(pollCtx)
	cancel()
	consumer.Close()
	if n := fs.NumRecords(); n > 0 {
		return "", fmt.Errorf("Fetch: read %d records from a topic that should not exist", n)
	}
	all, err := metadata(ctx, cl)
	if err != nil {
		return "", err
	}
	if _, ok := all[topic]; ok {
		deleteTopic(adm, topic)
		return "", fmt.Errorf("topic %s was created although auto-creation was off", topic)
	}
	return "Metadata: UNKNOWN_TOPIC_OR_PARTITION; topic not created", nil
}
