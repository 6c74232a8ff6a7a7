#!/usr/bin/env node
// The kafkajs part of security/run.sh (issue 31): one produce/consume round trip, or one
// refused connection, over an SSL, SASL_PLAINTEXT or SASL_SSL listener.
//
//   secure.js roundtrip <bootstrap> <topic> <n> [--key value ...]
//   secure.js refused <bootstrap> [--key value ...]
//
// Keys: --protocol SSL|SASL_PLAINTEXT|SASL_SSL, --mechanism PLAIN|SCRAM-SHA-512, --user,
// --password, --ca <PEM>, --cert <PEM> --key <PEM> (the client certificate), --timeout-ms
// (bound of the whole run, default 40000).
//
// roundtrip produces n records k-i:<topic>-v-i to partition 0 (acks=all) and reads them
// back from the beginning (kafkajs consumes only through a group: a run-unique group id),
// checking count, order, keys and values. refused connects an admin client and expects the
// broker to refuse: KafkaJSSASLAuthenticationError for SASL, a TLS/connection error for SSL.
// Prints one "ok ..." or "error: ..." line on stdout (kafkajs logs on stderr); exits 0 only
// when the expectation held.
'use strict'

const fs = require('fs')
const crypto = require('crypto')
const { Kafka, logLevel } = require('kafkajs')

function usage() {
  process.stderr.write('usage: secure.js roundtrip <bootstrap> <topic> <n> [--key value ...] | refused <bootstrap> [--key value ...]\n')
  process.exit(2)
}

const [mode, bootstrap, ...rest] = process.argv.slice(2)
if (!bootstrap) usage()
let topic
let n
if (mode === 'roundtrip') {
  topic = rest.shift()
  n = parseInt(rest.shift(), 10)
  if (!topic || !(n > 0)) usage()
} else if (mode !== 'refused') {
  usage()
}
const o = { protocol: 'SASL_SSL', mechanism: '', user: '', password: '', ca: '', cert: '', key: '', 'timeout-ms': '40000' }
for (let i = 0; i < rest.length; i += 2) {
  const k = rest[i].replace(/^--/, '')
  if (!(k in o) || i + 1 >= rest.length) usage()
  o[k] = rest[i + 1]
}
const timeoutMs = parseInt(o['timeout-ms'], 10)

function kafka() {
  const config = {
    clientId: 'compat-security-kafkajs',
    brokers: [bootstrap],
    connectionTimeout: 10000,
    authenticationTimeout: 10000,
    requestTimeout: 15000,
    retry: { retries: 1, initialRetryTime: 200 },
    logLevel: logLevel.WARN,
    logCreator: () => ({ namespace, level, log }) => {
      process.stderr.write(`[kafkajs ${level}] ${namespace}: ${log.message} ${log.error || ''}\n`)
    },
  }
  if (o.protocol === 'SSL' || o.protocol === 'SASL_SSL') {
    config.ssl = { ca: [fs.readFileSync(o.ca, 'utf8')] }
    if (o.cert) {
      config.ssl.cert = fs.readFileSync(o.cert, 'utf8')
      config.ssl.key = fs.readFileSync(o.key, 'utf8')
    }
  }
  if (o.mechanism) {
    config.sasl = { mechanism: o.mechanism.toLowerCase(), username: o.user, password: o.password }
  }
  return new Kafka(config)
}

const value = (i) => `${topic}-v-${i}`

async function roundtrip() {
  const k = kafka()
  const producer = k.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  try {
    const messages = []
    for (let i = 0; i < n; i++) messages.push({ key: `k-${i}`, value: value(i), partition: 0 })
    await producer.send({ topic, acks: -1, messages })
  } finally {
    await producer.disconnect()
  }
  const consumer = k.consumer({ groupId: `compat-security-kafkajs-${crypto.randomBytes(6).toString('hex')}` })
  const got = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    let resolve
    const all = new Promise((r) => { resolve = r })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        got.push({ partition, offset: message.offset, key: String(message.key), value: String(message.value) })
        if (got.length >= n) resolve()
      },
    })
    await all
  } finally {
    await consumer.disconnect()
  }
  if (got.length !== n) throw new Error(`read ${got.length} records, not the ${n} produced`)
  got.forEach((r, i) => {
    if (r.partition !== 0 || r.key !== `k-${i}` || r.value !== value(i)) {
      throw new Error(`record ${i} (partition ${r.partition} offset ${r.offset}) is ${r.key}:${r.value}`)
    }
  })
  return `ok ${n} records produced and read back`
}

async function refused() {
  const admin = kafka().admin()
  let err
  try {
    await admin.connect()
    await admin.fetchTopicMetadata({ topics: [] })
  } catch (e) {
    err = e
  } finally {
    await admin.disconnect().catch(() => {})
  }
  if (!err) throw new Error('metadata answered with bad credentials')
  const text = `${err.name}: ${err.message}`
  if (o.mechanism) {
    if (err.name === 'KafkaJSSASLAuthenticationError' || /SASL_AUTHENTICATION_FAILED|authentication failed/i.test(text)) {
      return `ok refused: ${text}`
    }
    throw new Error(`no SASL authentication error: ${text}`)
  }
  if (/tls|ssl|certificate|socket hang up|ECONNRESET|EPIPE|Connection error|closed/i.test(text)) return `ok refused: ${text}`
  throw new Error(`no TLS refusal: ${text}`)
}

const timer = setTimeout(() => {
  process.stdout.write(`error: not done within ${timeoutMs} ms\n`)
  process.exit(1)
}, timeoutMs)

;(mode === 'roundtrip' ? roundtrip() : refused()).then(
  (line) => {
    clearTimeout(timer)
    process.stdout.write(`${line}\n`)
    process.exit(0)
  },
  (e) => {
    clearTimeout(timer)
    process.stdout.write(`error: ${e && e.name ? e.name + ': ' : ''}${e && e.message ? e.message : e}\n`)
    process.exit(1)
  },
)
