package main

// The transaction scenarios (issue 30) with franz-go: txn.commit, txn.abort
// and txn.offsets (a GroupTransactSession read-process-write loop). Checks are
// exact, as the Java family's: which records read_committed and
// read_uncommitted consumers see and at which offsets (one control record per
// partition and transaction), the end offsets while a transaction is open, and
// where the group's offsets stand.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	sc "compat-tests/go/internal/scenario"
)

// txnWait bounds every wait for commit markers to land (EndTxn returns before
// the coordinator has written them).
const txnWait = 20 * time.Second

// txnRecord is record i of a tag: key-i and a value naming the tag, to a partition.
func txnRecord(topic string, partition int32, tag string, i int) *kgo.Record {
	return &kgo.Record{
		Topic:     topic,
		Partition: partition,
		Key:       []byte(fmt.Sprintf("key-%d", i)),
		Value:     []byte(fmt.Sprintf("value-%d-%s", i, tag)),
	}
}

// txnClient is a transactional producer with the client's defaults otherwise.
func txnClient(env *sc.Env, transactionalID string, opts ...kgo.Opt) (*kgo.Client, error) {
	return newClient(env, append([]kgo.Opt{
		kgo.TransactionalID(transactionalID),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}, opts...)...)
}

// inTxn produces the records in one transaction, ended with commit or abort,
// and returns them with their acknowledged offsets.
func inTxn(ctx context.Context, cl *kgo.Client, commit kgo.TransactionEndTry, recs []*kgo.Record) ([]*kgo.Record, error) {
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("BeginTransaction: %w", err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return nil, fmt.Errorf("Produce in a transaction: %w", err)
	}
	if err := cl.EndTransaction(ctx, commit); err != nil {
		return nil, fmt.Errorf("EndTxn (commit=%v): %w", commit, err)
	}
	return recs, nil
}

// spread builds n records of a tag, record base+j to partition j % partitions.
func spread(topic, tag string, base, n int, partitions int32) []*kgo.Record {
	out := make([]*kgo.Record, n)
	for j := range out {
		out[j] = txnRecord(topic, int32(j)%partitions, tag, base+j)
	}
	return out
}

// readIsolated reads exactly n records of the topic from the start under the
// isolation level, then checks nothing more arrives for a moment.
func readIsolated(ctx context.Context, env *sc.Env, topic string, partitions int32, n int, committed bool) ([]*kgo.Record, error) {
	level := kgo.ReadUncommitted()
	if committed {
		level = kgo.ReadCommitted()
	}
	cl, err := newClient(env, fromStart(topic, partitions), kgo.FetchIsolationLevel(level))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	pollCtx, cancel := context.WithTimeout(ctx, txnWait)
	defer cancel()
	for len(out) < n {
		fs := cl.PollFetches(pollCtx)
		if pollCtx.Err() != nil {
			return out, fmt.Errorf("Fetch (%s): read %d of %d records within %s", levelName(committed), len(out), n, txnWait)
		}
		if err := fetchErr(fs); err != nil {
			return out, err
		}
		out = append(out, fs.Records()...)
	}
	extraCtx, cancelExtra := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelExtra()
	if extra := cl.PollFetches(extraCtx).Records(); len(extra) > 0 || len(out) > n {
		return out, fmt.Errorf("Fetch (%s): %d records beyond the %d expected", levelName(committed), len(extra)+len(out)-n, n)
	}
	return out, nil
}

func fetchErr(fs kgo.Fetches) error {
	var first error
	fs.EachError(func(t string, p int32, err error) {
		if first == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			first = fmt.Errorf("Fetch %s[%d]: %w", t, p, err)
		}
	})
	return first
}

func levelName(committed bool) string {
	if committed {
		return "read_committed"
	}
	return "read_uncommitted"
}

// sameRecords checks that got are exactly want: per partition the same
// offsets in order with the same key and value.
func sameRecords(what string, want, got []*kgo.Record) error {
	type kv struct {
		offset     int64
		key, value string
	}
	index := func(rs []*kgo.Record) map[int32][]kv {
		out := map[int32][]kv{}
		for _, r := range rs {
			out[r.Partition] = append(out[r.Partition], kv{r.Offset, string(r.Key), string(r.Value)})
		}
		for _, l := range out {
			for i := 1; i < len(l); i++ {
				for j := i; j > 0 && l[j].offset < l[j-1].offset; j-- {
					l[j], l[j-1] = l[j-1], l[j]
				}
			}
		}
		return out
	}
	w, g := index(want), index(got)
	for p := range g {
		if _, ok := w[p]; !ok {
			return fmt.Errorf("%s: records from partition %d, expected none there", what, p)
		}
	}
	for p, wl := range w {
		gl := g[p]
		if len(gl) != len(wl) {
			return fmt.Errorf("%s partition %d: %d records, expected %d", what, p, len(gl), len(wl))
		}
		for i := range wl {
			if gl[i] != wl[i] {
				return fmt.Errorf("%s partition %d: read offset %d %s=%s, expected offset %d %s=%s", what, p,
					gl[i].offset, gl[i].key, gl[i].value, wl[i].offset, wl[i].key, wl[i].value)
			}
		}
	}
	return nil
}

// awaitEnds waits until ListOffsets (latest) under the isolation level answers
// the expected end offsets: the last stable offset under read_committed
// (kadm ListCommittedOffsets), the high watermark otherwise (ListEndOffsets).
func awaitEnds(ctx context.Context, adm *kadm.Client, topic string, committed bool, want []int64, when string) error {
	deadline := time.Now().Add(txnWait)
	for {
		list := adm.ListEndOffsets
		if committed {
			list = adm.ListCommittedOffsets
		}
		listed, err := list(ctx, topic)
		got := make([]int64, len(want))
		if err == nil {
			err = listed.Error()
			for p := range got {
				o, _ := listed.Lookup(topic, int32(p))
				got[p] = o.Offset
			}
		}
		if err == nil && reflect.DeepEqual(got, want) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ListOffsets (%s) %s: %v (err %v), expected %v", levelName(committed), when, got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// offsetRange returns the first and last acknowledged offsets of partition p.
func offsetRange(recs []*kgo.Record, p int32) (first, last int64) {
	first, last = -1, -1
	for _, r := range recs {
		if r.Partition != p {
			continue
		}
		if first < 0 || r.Offset < first {
			first = r.Offset
		}
		if r.Offset > last {
			last = r.Offset
		}
	}
	return first, last
}

func txnCommit(ctx context.Context, env *sc.Env) (string, error) {
	const partitions, txns, perTxn = 3, 3, 60
	topic := env.Topic("txn.commit")
	cl, err := txnClient(env, topic+"-tx")
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := createTopic(ctx, cl, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)
	var all []*kgo.Record
	ends := make([]int64, partitions)
	lasts := []int64{-2, -2, -2}
	for t := 0; t < txns; t++ {
		recs, err := inTxn(ctx, cl, kgo.TryCommit, spread(topic, fmt.Sprintf("t%d", t), t*perTxn, perTxn, partitions))
		if err != nil {
			return "", err
		}
		// One commit marker between transactions: each starts 2 after the previous one's last record.
		for p := int32(0); p < partitions; p++ {
			first, last := offsetRange(recs, p)
			if first != lasts[p]+2 || last-first+1 != perTxn/partitions {
				return "", fmt.Errorf("partition %d: transaction %d at offsets %d..%d, expected %d records from %d (one marker after the previous)",
					p, t, first, last, perTxn/partitions, lasts[p]+2)
			}
			lasts[p] = last
			ends[p] = last + 2
		}
		all = append(all, recs...)
	}
	got, err := readIsolated(ctx, env, topic, partitions, len(all), true)
	if err != nil {
		return "", err
	}
	if err := sameRecords("read_committed", all, got); err != nil {
		return "", err
	}
	for _, committed := range []bool{true, false} {
		if err := awaitEnds(ctx, adm, topic, committed, ends, "after the last commit"); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d transactions x %d records over %d partitions read back exactly (read_committed, offsets, order); one marker per partition and transaction, end offsets %v",
		txns, perTxn, partitions, ends), nil
}

func txnAbort(ctx context.Context, env *sc.Env) (string, error) {
	const partitions, perPartition = 2, 5
	const n = partitions * perPartition
	topic := env.Topic("txn.abort")
	p1, err := txnClient(env, topic+"-tx1")
	if err != nil {
		return "", err
	}
	defer p1.Close()
	p2, err := txnClient(env, topic+"-tx2")
	if err != nil {
		return "", err
	}
	defer p2.Close()
	adm := kadm.NewClient(p1)
	if err := createTopic(ctx, p1, topic, partitions, nil); err != nil {
		return "", err
	}
	defer deleteTopic(adm, topic)

	c0, err := inTxn(ctx, p1, kgo.TryCommit, spread(topic, "c0", 0, n, partitions))
	if err != nil {
		return "", err
	}
	// P1 opens a1 and leaves it open while P2 writes and commits c2 behind it.
	if err := p1.BeginTransaction(); err != nil {
		return "", fmt.Errorf("BeginTransaction: %w", err)
	}
	a1 := spread(topic, "a1", 100, n, partitions)
	if err := p1.ProduceSync(ctx, a1...).FirstErr(); err != nil {
		return "", fmt.Errorf("Produce a1: %w", err)
	}
	c2, err := inTxn(ctx, p2, kgo.TryCommit, spread(topic, "c2", 200, n, partitions))
	if err != nil {
		return "", err
	}
	lso := make([]int64, partitions)
	openEnd := make([]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		lso[p], _ = offsetRange(a1, p)
		_, last := offsetRange(c2, p)
		openEnd[p] = last + 2
	}
	if err := awaitEnds(ctx, adm, topic, false, openEnd, "while a1 is open"); err != nil {
		return "", err
	}
	if err := awaitEnds(ctx, adm, topic, true, lso, "while a1 is open (the last stable offset)"); err != nil {
		return "", err
	}
	stable, err := readIsolated(ctx, env, topic, partitions, len(c0), true)
	if err != nil {
		return "", err
	}
	if err := sameRecords("read_committed while a1 is open", c0, stable); err != nil {
		return "", err
	}
	if err := p1.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return "", fmt.Errorf("EndTxn (abort a1): %w", err)
	}
	c3, err := inTxn(ctx, p1, kgo.TryCommit, spread(topic, "c3", 300, n, partitions))
	if err != nil {
		return "", err
	}
	end := make([]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		_, last := offsetRange(c3, p)
		end[p] = last + 2
		if end[p] != 4*perPartition+4 {
			return "", fmt.Errorf("partition %d: log end %d after 4 transactions of %d records, expected %d (one marker each)",
				p, end[p], perPartition, 4*perPartition+4)
		}
	}
	for _, committed := range []bool{true, false} {
		if err := awaitEnds(ctx, adm, topic, committed, end, "after a1 aborted and c3 committed"); err != nil {
			return "", err
		}
	}
	committed := append(append(append([]*kgo.Record{}, c0...), c2...), c3...)
	got, err := readIsolated(ctx, env, topic, partitions, len(committed), true)
	if err != nil {
		return "", err
	}
	if err := sameRecords("read_committed", committed, got); err != nil {
		return "", err
	}
	everything := append(append([]*kgo.Record{}, committed...), a1...)
	got, err = readIsolated(ctx, env, topic, partitions, len(everything), false)
	if err != nil {
		return "", err
	}
	if err := sameRecords("read_uncommitted", everything, got); err != nil {
		return "", err
	}
	return fmt.Sprintf("while a1 open: read_committed end offsets = LSO %v, read_uncommitted %v, only c0 visible; after abort: read_committed %d records (c0 c2 c3), read_uncommitted %d (with a1), end %v",
		lso, openEnd, len(committed), len(everything), end), nil
}

// txnOffsets is read-process-write with a GroupTransactSession: each poll of
// at most 10 input records goes to the output topic and the group's offsets in
// one transaction (End(TryCommit) sends TxnOffsetCommit then EndTxn). Round 1
// ends with TryAbort: the session rewinds to the committed offsets and the
// group's offsets (OffsetFetch, RequireStable) must not move. The output under
// read_committed then holds every input record exactly once, in order.
func txnOffsets(ctx context.Context, env *sc.Env) (string, error) {
	const partitions, perPartition, abortedRound = 3, 20, 1
	const n = partitions * perPartition
	in := env.Topic("txn.offsets") + "-in"
	out := env.Topic("txn.offsets") + "-out"
	group := env.Topic("txn.offsets") + "-group"
	plain, err := newClient(env, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return "", err
	}
	defer plain.Close()
	adm := kadm.NewClient(plain)
	for _, t := range []string{in, out} {
		if err := createTopic(ctx, plain, t, partitions, nil); err != nil {
			return "", err
		}
		defer deleteTopic(adm, t)
	}
	if err := plain.ProduceSync(ctx, spread(in, "in", 0, n, partitions)...).FirstErr(); err != nil {
		return "", fmt.Errorf("Produce input: %w", err)
	}

	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(env.Bootstrap),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.TransactionalID(out+"-tx"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(in),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return "", fmt.Errorf("NewGroupTransactSession: %w", err)
	}
	defer sess.Close()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroups(dctx, group)
	}()

	committed := map[int32]int64{}
	processed, rounds, aborted := 0, 0, 0
	abortDetail := ""
	lastProgress := time.Now()
	for processed < n {
		pollCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := sess.PollRecords(pollCtx, 10)
		cancel()
		if err := fetchErr(fs); err != nil {
			return "", err
		}
		recs := fs.Records()
		if len(recs) == 0 {
			if time.Since(lastProgress) > txnWait {
				return "", fmt.Errorf("group session read %d of %d input records, then nothing for %s", processed, n, txnWait)
			}
			continue
		}
		lastProgress = time.Now()
		if err := sess.Begin(); err != nil {
			return "", fmt.Errorf("Begin: %w", err)
		}
		next := map[int32]int64{}
		outRecs := make([]*kgo.Record, len(recs))
		for i, r := range recs {
			next[r.Partition] = r.Offset + 1
			outRecs[i] = &kgo.Record{Topic: out, Partition: r.Partition, Key: r.Key, Value: append([]byte("out-"), r.Value...)}
		}
		if err := sess.ProduceSync(ctx, outRecs...).FirstErr(); err != nil {
			return "", fmt.Errorf("Produce output: %w", err)
		}
		if rounds == abortedRound {
			ok, err := sess.End(ctx, kgo.TryAbort)
			if err != nil || ok {
				return "", fmt.Errorf("End(TryAbort): committed=%v err=%v", ok, err)
			}
			aborted = len(recs)
			stable, err := groupOffsets(ctx, adm, group, in)
			if err != nil {
				return "", err
			}
			if !reflect.DeepEqual(stable, committed) {
				return "", fmt.Errorf("OffsetFetch (RequireStable) after the aborted round: %v, expected the offsets before it %v", stable, committed)
			}
			abortDetail = fmt.Sprintf("offsets after the aborted round of %d records unchanged %v", aborted, committed)
		} else {
			ok, err := sess.End(ctx, kgo.TryCommit)
			if err != nil || !ok {
				return "", fmt.Errorf("End(TryCommit) of round %d: committed=%v err=%v", rounds, ok, err)
			}
			for p, o := range next {
				committed[p] = o
			}
			processed += len(recs)
		}
		rounds++
	}
	if rounds <= abortedRound+1 {
		return "", fmt.Errorf("only %d rounds: the aborted round was the last", rounds)
	}
	final, err := groupOffsets(ctx, adm, group, in)
	if err != nil {
		return "", err
	}
	want := map[int32]int64{0: perPartition, 1: perPartition, 2: perPartition}
	if !reflect.DeepEqual(final, want) {
		return "", fmt.Errorf("OffsetFetch (RequireStable) at the end: %v, expected %v", final, want)
	}
	got, err := readIsolated(ctx, env, out, partitions, n, true)
	if err != nil {
		return "", err
	}
	perPart := map[int32][]string{}
	for _, r := range got {
		perPart[r.Partition] = append(perPart[r.Partition], string(r.Value))
	}
	for p := int32(0); p < partitions; p++ {
		for j := 0; j < perPartition; j++ {
			wantValue := fmt.Sprintf("out-value-%d-in", j*partitions+int(p))
			if j >= len(perPart[p]) || perPart[p][j] != wantValue {
				return "", fmt.Errorf("output partition %d position %d: not %q (no duplicate, no gap): %d records", p, j, wantValue, len(perPart[p]))
			}
		}
	}
	if _, err := readIsolated(ctx, env, out, partitions, n+aborted, false); err != nil {
		return "", fmt.Errorf("output under read_uncommitted, expected %d + %d aborted: %w", n, aborted, err)
	}
	return fmt.Sprintf("%d input records in %d GroupTransactSession rounds (round %d aborted); %s; output read_committed exactly once in order, read_uncommitted %d (+%d aborted); group offsets = end offsets %d",
		n, rounds, abortedRound, abortDetail, n+aborted, aborted, perPartition), nil
}

// groupOffsets is the group's committed offsets of a topic, fetched with
// RequireStable: while a transactional commit is pending (its marker not yet
// written) the broker answers UNSTABLE_OFFSET_COMMIT, which kadm returns as is,
// so it is retried here within txnWait.
func groupOffsets(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	deadline := time.Now().Add(txnWait)
	unstable := 0
	for {
		resps, err := adm.FetchOffsets(kadm.RequireStable(ctx), group)
		if err == nil {
			err = resps.Error()
		}
		if errors.Is(err, kerr.UnstableOffsetCommit) && time.Now().Before(deadline) {
			unstable++
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("OffsetFetch (RequireStable) of %s (after %d UNSTABLE_OFFSET_COMMIT answers): %w", group, unstable, err)
		}
		out := map[int32]int64{}
		resps.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.At >= 0 {
				out[o.Partition] = o.At
			}
		})
		return out, nil
	}
}
