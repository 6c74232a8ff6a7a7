// Command secure is the franz-go and sarama part of security/run.sh (issue 31):
// one produce/consume round trip, or one refused connection, over an SSL,
// SASL_PLAINTEXT or SASL_SSL listener.
//
//	secure <franz|sarama> roundtrip <bootstrap> <topic> <n> [flags]
//	secure <franz|sarama> refused <bootstrap> [flags]
//
// Flags: -protocol SSL|SASL_PLAINTEXT|SASL_SSL, -mechanism PLAIN|SCRAM-SHA-512
// (empty: none), -user, -password, -ca <PEM>, -cert <PEM> -key <PEM> (the
// client certificate; omitted means none), -timeout (the bound of every
// client call, default 30s).
//
// roundtrip produces n records k-i:<topic>-v-i to partition 0 of <topic>
// (acks=all) and reads them back from offset 0, checking count, order, keys
// and values. refused asks for metadata and expects the broker to refuse:
// SASL_AUTHENTICATION_FAILED for SASL, a TLS failure for SSL. Prints one
// "ok ..." or "error: ..." line on stdout; exits 0 only when the expectation
// held.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

type opts struct {
	protocol, mechanism, user, password, ca, cert, key string
	timeout                                            time.Duration
}

// What a refused TLS client sees: the broker's alert, or the connection
// closed during or right after the handshake.
var tlsRefusal = regexp.MustCompile(`(?i)tls|certificate|x509|EOF|reset by peer|broken pipe`)

func main() {
	if len(os.Args) < 4 {
		usage()
	}
	client, mode, bootstrap := os.Args[1], os.Args[2], os.Args[3]
	rest := os.Args[4:]
	var topic string
	var n int
	if mode == "roundtrip" {
		if len(rest) < 2 {
			usage()
		}
		topic = rest[0]
		if _, err := fmt.Sscan(rest[1], &n); err != nil || n <= 0 {
			usage()
		}
		rest = rest[2:]
	}
	var o opts
	fs := flag.NewFlagSet("secure", flag.ExitOnError)
	fs.StringVar(&o.protocol, "protocol", "SASL_SSL", "security.protocol")
	fs.StringVar(&o.mechanism, "mechanism", "", "SASL mechanism (PLAIN, SCRAM-SHA-512)")
	fs.StringVar(&o.user, "user", "", "SASL user")
	fs.StringVar(&o.password, "password", "", "SASL password")
	fs.StringVar(&o.ca, "ca", "", "CA certificate (PEM)")
	fs.StringVar(&o.cert, "cert", "", "client certificate (PEM)")
	fs.StringVar(&o.key, "key", "", "client private key (PEM)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound of each client call")
	_ = fs.Parse(rest)

	var err error
	switch client + " " + mode {
	case "franz roundtrip":
		err = franzRoundTrip(o, bootstrap, topic, n)
	case "franz refused":
		err = refused(o, franzMetadata(o, bootstrap))
	case "sarama roundtrip":
		err = saramaRoundTrip(o, bootstrap, topic, n)
	case "sarama refused":
		err = refused(o, saramaMetadata(o, bootstrap))
	default:
		usage()
	}
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: secure <franz|sarama> roundtrip <bootstrap> <topic> <n> [flags]\n       secure <franz|sarama> refused <bootstrap> [flags]")
	os.Exit(2)
}

// refused turns the outcome of a metadata request with bad credentials into
// the verdict: nil only for the refusal the listener should give.
func refused(o opts, err error) error {
	switch {
	case err == nil:
		return errors.New("metadata answered with bad credentials")
	case o.mechanism != "":
		if isSaslAuthFailed(err) {
			fmt.Printf("ok refused: %v\n", err)
			return nil
		}
		return fmt.Errorf("no SASL_AUTHENTICATION_FAILED: %w", err)
	default:
		if tlsRefusal.MatchString(err.Error()) {
			fmt.Printf("ok refused: %v\n", err)
			return nil
		}
		return fmt.Errorf("no TLS refusal: %w", err)
	}
}

func isSaslAuthFailed(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) ||
		errors.Is(err, sarama.ErrSASLAuthenticationFailed) ||
		regexp.MustCompile(`SASL Authentication failed|SASL_AUTHENTICATION_FAILED`).MatchString(err.Error())
}

func tlsConfig(o opts) (*tls.Config, error) {
	if o.protocol != "SSL" && o.protocol != "SASL_SSL" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.ca != "" {
		pem, err := os.ReadFile(o.ca)
		if err != nil {
			return nil, err
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", o.ca)
		}
	}
	if o.cert != "" {
		pair, err := tls.LoadX509KeyPair(o.cert, o.key)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

func value(topic string, i int) string { return fmt.Sprintf("%s-v-%d", topic, i) }

// check compares what was read with what was produced.
func check(topic string, n int, keys, values []string, offsets []int64) error {
	if len(keys) != n {
		return fmt.Errorf("read %d records, not the %d produced", len(keys), n)
	}
	for i := range keys {
		if keys[i] != fmt.Sprintf("k-%d", i) || values[i] != value(topic, i) {
			return fmt.Errorf("record %d (offset %d) is %s:%s", i, offsets[i], keys[i], values[i])
		}
	}
	return nil
}

// ------------------------------------------------------------------ franz-go

func franzOpts(o opts, bootstrap string) ([]kgo.Opt, error) {
	t, err := tlsConfig(o)
	if err != nil {
		return nil, err
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelWarn, func() string { return "[franz] " })),
		kgo.DialTimeout(10 * time.Second),
		kgo.RequestRetries(2),
	}
	if t != nil {
		kopts = append(kopts, kgo.DialTLSConfig(t))
	}
	var m sasl.Mechanism
	switch o.mechanism {
	case "":
	case "PLAIN":
		m = plain.Auth{User: o.user, Pass: o.password}.AsMechanism()
	case "SCRAM-SHA-512":
		m = scram.Auth{User: o.user, Pass: o.password}.AsSha512Mechanism()
	default:
		return nil, fmt.Errorf("unknown mechanism %s", o.mechanism)
	}
	if m != nil {
		kopts = append(kopts, kgo.SASL(m))
	}
	return kopts, nil
}

func franzRoundTrip(o opts, bootstrap, topic string, n int) error {
	base, err := franzOpts(o, bootstrap)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	p, err := kgo.NewClient(append(base, kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return err
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: 0, Key: []byte(fmt.Sprintf("k-%d", i)), Value: []byte(value(topic, i))}
	}
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		p.Close()
		return fmt.Errorf("produce: %w", err)
	}
	p.Close()

	c, err := kgo.NewClient(append(base, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {0: kgo.NewOffset().AtStart()},
	}))...)
	if err != nil {
		return err
	}
	defer c.Close()
	var keys, values []string
	var offsets []int64
	for len(keys) < n {
		fetches := c.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("consume: read %d of %d records before the %s bound", len(keys), n, o.timeout)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return fmt.Errorf("consume: %w", errs[0].Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			keys = append(keys, string(r.Key))
			values = append(values, string(r.Value))
			offsets = append(offsets, r.Offset)
		})
	}
	if err := check(topic, n, keys, values, offsets); err != nil {
		return err
	}
	fmt.Printf("ok %d records produced and read back\n", n)
	return nil
}

func franzMetadata(o opts, bootstrap string) error {
	base, err := franzOpts(o, bootstrap)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(base...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	return cl.Ping(ctx)
}

// ------------------------------------------------------------------ sarama

// scramClient gives sarama (which leaves SCRAM's client side to the
// application) franz-go's SCRAM-SHA-512 conversation: sarama sends the
// messages, franz-go's session computes them.
type scramClient struct {
	mech    sasl.Mechanism
	session sasl.Session
	done    bool
	first   []byte
}

func (s *scramClient) Begin(user, password, _ string) error {
	s.mech = scram.Auth{User: user, Pass: password}.AsSha512Mechanism()
	var err error
	s.session, s.first, err = s.mech.Authenticate(context.Background(), "")
	return err
}

func (s *scramClient) Step(challenge string) (string, error) {
	if s.first != nil {
		first := s.first
		s.first = nil
		return string(first), nil
	}
	done, resp, err := s.session.Challenge([]byte(challenge))
	s.done = done
	return string(resp), err
}

func (s *scramClient) Done() bool { return s.done }

func saramaConfig(o opts) (*sarama.Config, error) {
	c := sarama.NewConfig()
	c.Version = sarama.MaxVersion
	c.ClientID = "compat-security-sarama"
	c.Net.DialTimeout = 10 * time.Second
	c.Net.ReadTimeout = o.timeout
	c.Net.WriteTimeout = o.timeout
	c.Metadata.Retry.Max = 1
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	t, err := tlsConfig(o)
	if err != nil {
		return nil, err
	}
	if t != nil {
		c.Net.TLS.Enable = true
		c.Net.TLS.Config = t
	}
	switch o.mechanism {
	case "":
	case "PLAIN":
		c.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case "SCRAM-SHA-512":
		c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		c.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{} }
	default:
		return nil, fmt.Errorf("unknown mechanism %s", o.mechanism)
	}
	if o.mechanism != "" {
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.Version = sarama.SASLHandshakeV1
		c.Net.SASL.User = o.user
		c.Net.SASL.Password = o.password
	}
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Retry.Max = 2
	return c, nil
}

func saramaRoundTrip(o opts, bootstrap, topic string, n int) error {
	cfg, err := saramaConfig(o)
	if err != nil {
		return err
	}
	client, err := sarama.NewClient([]string{bootstrap}, cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer client.Close()
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Partition: 0,
			Key: sarama.StringEncoder(fmt.Sprintf("k-%d", i)), Value: sarama.StringEncoder(value(topic, i))}
	}
	if err := p.SendMessages(msgs); err != nil {
		_ = p.Close()
		return fmt.Errorf("produce: %w", err)
	}
	_ = p.Close()

	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		return fmt.Errorf("consume partition: %w", err)
	}
	defer pc.Close()
	deadline := time.After(o.timeout)
	var keys, values []string
	var offsets []int64
	for len(keys) < n {
		select {
		case m := <-pc.Messages():
			keys = append(keys, string(m.Key))
			values = append(values, string(m.Value))
			offsets = append(offsets, m.Offset)
		case e := <-pc.Errors():
			return fmt.Errorf("consume: %w", e)
		case <-deadline:
			return fmt.Errorf("consume: read %d of %d records before the %s bound", len(keys), n, o.timeout)
		}
	}
	if err := check(topic, n, keys, values, offsets); err != nil {
		return err
	}
	fmt.Printf("ok %d records produced and read back\n", n)
	return nil
}

func saramaMetadata(o opts, bootstrap string) error {
	cfg, err := saramaConfig(o)
	if err != nil {
		return err
	}
	client, err := sarama.NewClient([]string{bootstrap}, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	return client.RefreshMetadata()
}
