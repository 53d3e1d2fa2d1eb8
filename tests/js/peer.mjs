// A JavaScript libp2p peer set up the way aikyo 1.6 sets up its companions (TCP, Noise, Yamux,
// gossipsub with allowPublishToZeroTopicPeers and emitSelf, identify, the /aikyo/metadata/1.0.0
// protocol), for the interop test. Exactly aikyo's services: no ping (aikyo's default libp2p
// config, packages/server/lib/server/libp2p/mergeConfig.ts, mounts only pubsub and identify;
// its mDNS discovery is left out, the test dials).
// Commands arrive on stdin and events leave on stdout, one JSON object per line.
//
//   node peer.mjs '<metadata json>'
//   stdin:  {"op":"dial","addr":MULTIADDR} | {"op":"publish","topic":T,"text":S} | {"op":"stop"}
//   stdout: started, metadata, metadata_empty, metadata_error, subscriptions, message, connected,
//           disconnected, dialled, published, error
//
// For scripts/bench_network.py (unused by the interop test; nothing changes until one arrives):
//   stdin:  {"op":"bench_warm","seq":N} | {"op":"bench_begin","run":R}
//           | {"op":"bench_blast","run":R,"rate":MSG_PER_S,"count":N} | {"op":"bench_report"}
//   stdout: bench_warm (a warm-up message arrived), bench_begun, bench_blasted, bench_report
// Bench payloads are aikyo message.send envelopes on "messages" whose text is JSON
// {"bench":"warm"|"data","run","seq","t"} (t: the sender's wall clock in seconds); once a bench
// command arrived they are counted here instead of emitted one "message" event each.
//
// For scripts/bench_conversation.py: {"op":"bench_turn","name":NAME} makes this peer play the
// bare reference network's turn from then on, and emit no "message" events: a message.send on
// "messages" whose params.metadata.bench_leader is NAME is answered by a states array naming
// params.metadata.bench_speaker, published on "states"; such an array whose speaker is NAME is
// answered by a reply on "messages" (in_reply_to the message). Acknowledged with bench_turning.

// For the mixed-network test and scripts/bench_mixed.py: {"op":"aikyo","delay_ms":N} makes this
// peer behave from then on as aikyo 1.6's CompanionServer and CompanionAgent do on "messages" and
// "states" (packages/server/lib/server/handlers/pubsub.ts, companionServer.ts, agents/index.ts,
// conversation/index.ts, utils/tools/core speak), its model replaced by rules that take delay_ms
// per model call, and its model calls made in aikyo's order, under aikyo's one "generating" flag:
// - a message.send that addresses it: unless it is generating, it picks the leader as aikyo does
//   (md5 of JSON.stringify(message) in schema field order, modulo the addressed ids it knows as
//   companions, itself included); as the leader, generating, it asks the state judge for each
//   addressed id at once (one call), and the repetition judge too once its history holds five
//   messages (a second call), then publishes one state per addressed id (people included),
//   unawaited: each closing "none", none selected, "speak" with an importance from the message
//   id for companions, "listen" 0 for people. (aikyo's state judge is a model that may say any
//   stage and its repetition judge raises the stage on a score above 0.7; this rule model says
//   "none" and scores no repetition. Neither knows a turn limit.)
// - any states array (its own too: emitSelf): unless it is generating, aikyo's decideNextSpeaker
//   over the ids it knows; nothing when nobody or terminal; when it is the top speaker, generating:
//   the parameters call, the agent's call that uses the speak tool, whose reply (to the last
//   message's sender and addressees, itself left out; metadata {emotion} only) is published
//   unawaited, then the agent's call after the tool result. Only the top speaker ever replies:
//   no stand-ins, yields are ignored (aikyo does not subscribe to "actions").
// Acknowledged with aikyo_on; emits aikyo_led (message id) and aikyo_replied (reply id, to) as it
// acts, besides the usual "message" events.

// libp2p 2.9's dependencies call Promise.withResolvers (Node.js 22+); provide it on older Node.
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function withResolvers () {
    let resolve, reject
    const promise = new this((res, rej) => { resolve = res; reject = rej })
    return { promise, resolve, reject }
  }
}

const { createLibp2p } = await import('libp2p')
const { tcp } = await import('@libp2p/tcp')
const { noise } = await import('@chainsafe/libp2p-noise')
const { yamux } = await import('@chainsafe/libp2p-yamux')
const { gossipsub } = await import('@chainsafe/libp2p-gossipsub')
const { identify } = await import('@libp2p/identify')
const { multiaddr } = await import('@multiformats/multiaddr')
const readline = await import('node:readline')
const { createHash } = await import('node:crypto')

const METADATA_PROTOCOL = '/aikyo/metadata/1.0.0'
const TOPICS = ['messages', 'states', 'queries', 'actions']
const me = JSON.parse(process.argv[2])
const known = new Map() // peer id -> metadata, as aikyo keeps its companion list
const bench = { on: false, run: -1, latencies: [], seen: new Set() } // benchmark commands only
const turn = { name: null } // bench_conversation.py's turn, once bench_turn named this peer
const aikyo = { on: false, delay: 0, generating: false, history: [] } // aikyo's behaviour, once asked

function emit (event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n')
}

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    pubsub: gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: true }),
    identify: identify()
  }
})

// Like aikyo: a peer already known gets an empty answer. Two aikyo peers that ask each other at
// once can so never learn each other (aikyo's own race: the one whose ask lands second gets the
// empty answer); with --answer-known (the mixed-network tests, whose JavaScript peers must know
// each other before any turn) every ask gets the metadata.
const answerKnown = process.argv.includes('--answer-known')
await node.handle(METADATA_PROTOCOL, async ({ stream, connection }) => {
  if (!answerKnown && known.has(connection.remotePeer.toString())) {
    await stream.close()
    return
  }
  await stream.sink([new TextEncoder().encode(JSON.stringify(me))])
  await stream.close()
})

// Like aikyo: ask a peer for its metadata once identify has run, keep only the first chunk.
// Unlike aikyo, a failed ask is tried again (twice, a second apart): on a machine at a load of 15
// a stream's protocol negotiation can fail, and aikyo, which asks once, would never know that
// peer; what the tests check of these peers is turn-taking, not that start-up race.
const METADATA_TRIES = 3
node.addEventListener('peer:identify', (evt) => { askMetadata(evt.detail.peerId, 1) })

async function askMetadata (peer, attempt) {
  const id = peer.toString()
  if (known.has(id)) return
  try {
    const stream = await node.dialProtocol(peer, METADATA_PROTOCOL)
    const chunks = []
    for await (const chunk of stream.source) chunks.push(chunk.subarray())
    if (chunks.length === 0) {
      emit('metadata_empty', { peer: id })
      return
    }
    const metadata = JSON.parse(new TextDecoder().decode(chunks[0]))
    known.set(id, metadata)
    emit('metadata', { peer: id, metadata })
  } catch (err) {
    emit('metadata_error', { peer: id, error: String(err), attempt })
    if (attempt < METADATA_TRIES) setTimeout(() => { askMetadata(peer, attempt + 1) }, 1000)
  }
}

node.addEventListener('peer:connect', (evt) => emit('connected', { peer: evt.detail.toString() }))
node.addEventListener('peer:disconnect', (evt) => {
  known.delete(evt.detail.toString())
  emit('disconnected', { peer: evt.detail.toString() })
})

const pubsub = node.services.pubsub
pubsub.addEventListener('subscription-change', (evt) => {
  emit('subscriptions', {
    peer: evt.detail.peerId.toString(),
    topics: evt.detail.subscriptions.filter((s) => s.subscribe).map((s) => s.topic)
  })
})
pubsub.addEventListener('gossipsub:message', (evt) => {
  const msg = evt.detail.msg
  if (aikyo.on) aikyoReceived(msg)
  if (turn.name !== null) {
    turnReceived(msg)
    return
  }
  if (bench.on && benchReceived(msg)) return
  emit('message', {
    topic: msg.topic,
    from: msg.from.toString(),
    seqno: msg.sequenceNumber.toString(),
    msgId: evt.detail.msgId,
    text: new TextDecoder().decode(msg.data)
  })
})
for (const topic of TOPICS) pubsub.subscribe(topic)

// --- benchmark commands ---------------------------------------------------------------------

function benchBody (text) {
  try {
    const envelope = JSON.parse(text)
    if (envelope?.method !== 'message.send') return null
    const body = JSON.parse(envelope.params.message)
    return body && typeof body === 'object' && typeof body.bench === 'string' ? body : null
  } catch {
    return null
  }
}

// true when msg was a bench payload (counted, not emitted)
function benchReceived (msg) {
  const arrived = Date.now() / 1000
  if (msg.topic !== 'messages') return false
  const body = benchBody(new TextDecoder().decode(msg.data))
  if (body === null) return false
  if (msg.from.equals(node.peerId)) return true // emitSelf: our own publish
  if (body.bench === 'warm') {
    emit('bench_warm', { seq: body.seq })
  } else if (body.run === bench.run && !bench.seen.has(body.seq)) {
    bench.seen.add(body.seq)
    bench.latencies.push(arrived - body.t)
  }
  return true
}

function benchEnvelope (body) {
  const envelope = {
    jsonrpc: '2.0',
    method: 'message.send',
    params: { id: crypto.randomUUID(), from: me.id, to: [], message: JSON.stringify(body) }
  }
  return new TextEncoder().encode(JSON.stringify(envelope))
}

async function benchBlast (run, rate, count) {
  const start = performance.now()
  for (let seq = 0; seq < count; seq++) {
    const wait = start + (seq * 1000) / rate - performance.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    try {
      await pubsub.publish('messages', benchEnvelope({ bench: 'data', run, seq, t: Date.now() / 1000 }))
    } catch (err) {
      emit('error', { op: 'bench_blast', error: String(err) })
    }
  }
  emit('bench_blasted', { run, count })
}

// bench_conversation.py's turn (see the header): what the bare py-libp2p reference nodes do
function turnReceived (msg) {
  if (msg.from.equals(node.peerId)) return // emitSelf: our own publish
  let body
  try {
    body = JSON.parse(new TextDecoder().decode(msg.data))
  } catch {
    return
  }
  if (msg.topic === 'messages' && body?.method === 'message.send') {
    const params = body.params ?? {}
    const meta = params.metadata ?? {}
    if (meta.bench_leader !== turn.name || !Array.isArray(params.to)) return
    const speaker = meta.bench_speaker
    const states = params.to.map((cid) => ({
      jsonrpc: '2.0',
      method: 'state.send',
      params: {
        from: cid,
        state: cid === speaker ? 'speak' : 'listen',
        importance: 5,
        selected: cid === speaker,
        closing: 'none'
      }
    }))
    const array = { for: params.id, sender: params.from, speaker, states }
    turnPublish('states', array)
  } else if (msg.topic === 'states' && body?.speaker === turn.name) {
    const reply = {
      jsonrpc: '2.0',
      method: 'message.send',
      params: {
        id: crypto.randomUUID(),
        from: turn.name,
        to: [body.sender],
        message: `${turn.name} answers: a short reply of about the length companions give.`,
        metadata: { in_reply_to: body.for, turn: 1, closing: 'none' }
      }
    }
    turnPublish('messages', reply)
  }
}

function turnPublish (topic, body) {
  pubsub.publish(topic, new TextEncoder().encode(JSON.stringify(body))).catch((err) => {
    emit('error', { op: 'bench_turn', error: String(err) })
  })
}

// --- aikyo 1.6's CompanionServer on messages and states (see the header) ---------------------

function aikyoActive () {
  // aikyo's companionList: itself, and the companions whose metadata it read over a connection
  return [me.id, ...Array.from(known.values()).map((m) => m.id)]
}

function aikyoParse (msg, method) {
  try {
    const body = JSON.parse(new TextDecoder().decode(msg.data))
    if (method === 'state.send') return Array.isArray(body) && body.every(aikyoState) ? body : null
    const p = body?.params
    if (body === null || typeof body !== 'object' || Object.keys(body).sort().join() !== 'jsonrpc,method,params') return null
    if (body.jsonrpc !== '2.0' || body.method !== method || p === null || typeof p !== 'object') return null
    if (typeof p.id !== 'string' || typeof p.from !== 'string' || typeof p.message !== 'string') return null
    if (!Array.isArray(p.to) || !p.to.every((t) => typeof t === 'string')) return null
    if (p.metadata !== undefined && (p.metadata === null || typeof p.metadata !== 'object' || Array.isArray(p.metadata))) return null
    // zod's parse output: schema field order, unknown keys of params dropped
    const params = { id: p.id, from: p.from, to: p.to, message: p.message }
    if (p.metadata !== undefined) params.metadata = p.metadata
    return { jsonrpc: body.jsonrpc, method: body.method, params }
  } catch {
    return null
  }
}

const STATE_KEYS = ['closing', 'from', 'importance', 'selected', 'state']

// zod's StateSchema, strict as aikyo's: an array with one state it refuses is dropped whole
function aikyoState (s) {
  const p = s?.params
  if (s === null || typeof s !== 'object' || Object.keys(s).sort().join() !== 'jsonrpc,method,params') return false
  if (s.jsonrpc !== '2.0' || s.method !== 'state.send' || p === null || typeof p !== 'object') return false
  if (!Object.keys(p).every((k) => STATE_KEYS.includes(k))) return false
  if (p.closing === undefined) p.closing = 'none' // zod's default
  return typeof p.from === 'string' && ['speak', 'listen'].includes(p.state) &&
    typeof p.importance === 'number' && p.importance >= 0 && p.importance <= 10 &&
    typeof p.selected === 'boolean' && ['none', 'pre-closing', 'closing', 'terminal'].includes(p.closing)
}

function aikyoLeader (message) {
  const active = aikyoActive()
  const valid = message.params.to.filter((to) => active.includes(to))
  if (valid.length === 0) return undefined
  const hash = createHash('md5').update(JSON.stringify(message)).digest('hex')
  return valid[Number(BigInt(`0x${hash}`) % BigInt(valid.length))]
}

function aikyoImportance (messageId, cid) {
  return createHash('md5').update(`${messageId}/${cid}`).digest()[0] % 11
}

function aikyoDecide (states) {
  const active = aikyoActive()
  const valid = states.filter((s) => active.includes(s.params.from))
  const byImportance = (a, b) => b.params.importance - a.params.importance
  const selected = valid.filter((s) => s.params.selected)
  if (selected.length > 0) return selected.sort(byImportance)[0]
  const speakers = valid.filter((s) => s.params.state === 'speak')
  if (speakers.length > 0) return speakers.sort(byImportance)[0]
  return undefined
}

function aikyoModel () {
  return new Promise((resolve) => setTimeout(resolve, aikyo.delay))
}

async function aikyoReceived (msg) {
  if (msg.topic === 'messages') {
    const message = aikyoParse(msg, 'message.send')
    if (message === null) return
    aikyo.history.push(message)
    if (aikyo.history.length > 5) aikyo.history.shift()
    if (!message.params.to.includes(me.id) || aikyo.generating) return
    if (aikyoLeader(message) !== me.id) return
    aikyo.generating = true
    try {
      await aikyoModel() // the state judge, for every addressee at once (Promise.all)
      if (aikyo.history.length >= 5) await aikyoModel() // the repetition judge after it
      const states = message.params.to.map((to) => {
        const companion = to.startsWith('companion_')
        const importance = companion ? aikyoImportance(message.params.id, to) : 0
        return {
          jsonrpc: '2.0',
          method: 'state.send',
          params: { from: to, state: companion ? 'speak' : 'listen', importance, selected: false, closing: 'none' }
        }
      })
      // not awaited, as aikyo: its own array (emitSelf) comes back once it is no longer generating
      pubsub.publish('states', new TextEncoder().encode(JSON.stringify(states))).catch((err) => {
        emit('error', { op: 'aikyo_lead', error: String(err) })
      })
      emit('aikyo_led', { message_id: message.params.id })
    } catch (err) {
      emit('error', { op: 'aikyo_lead', error: String(err) })
    } finally {
      aikyo.generating = false
    }
  } else if (msg.topic === 'states') {
    const states = aikyoParse(msg, 'state.send')
    if (states === null || aikyo.generating) return
    aikyo.generating = true
    try {
      const speaker = aikyoDecide(states)
      if (!speaker || speaker.params.closing === 'terminal') return // "The conversation is over."
      if (speaker.params.from !== me.id) return
      await aikyoModel() // the workflow's parameters call (evaluate step)
      await aikyoModel() // the agent's call that calls the speak tool
      const last = aikyo.history[aikyo.history.length - 1]
      const to = last ? [...new Set([last.params.from, ...last.params.to])].filter((id) => id !== me.id) : []
      const reply = {
        jsonrpc: '2.0',
        method: 'message.send',
        params: {
          id: crypto.randomUUID(),
          from: me.id,
          to,
          message: `${me.name} answers: a line of about the length companions say.`,
          metadata: { emotion: 'neutral' }
        }
      }
      // the speak tool publishes without awaiting; the agent calls its model once more with
      // the tool's result, still generating
      pubsub.publish('messages', new TextEncoder().encode(JSON.stringify(reply))).catch((err) => {
        emit('error', { op: 'aikyo_reply', error: String(err) })
      })
      emit('aikyo_replied', { reply_id: reply.params.id, to })
      await aikyoModel()
    } catch (err) {
      emit('error', { op: 'aikyo_reply', error: String(err) })
    } finally {
      aikyo.generating = false
    }
  }
}

async function benchCommand (command) {
  if (command.op === 'bench_turn') {
    turn.name = command.name
    emit('bench_turning', { name: turn.name })
    return
  }
  bench.on = true
  if (command.op === 'bench_warm') {
    await pubsub.publish('messages', benchEnvelope({ bench: 'warm', seq: command.seq, t: Date.now() / 1000 }))
  } else if (command.op === 'bench_begin') {
    bench.run = command.run
    bench.latencies = []
    bench.seen = new Set()
    emit('bench_begun', { run: bench.run })
  } else if (command.op === 'bench_blast') {
    benchBlast(command.run, command.rate, command.count) // runs on while commands keep coming
  } else if (command.op === 'bench_report') {
    emit('bench_report', {
      latencies: bench.latencies,
      connections: node.getPeers().length,
      mesh: pubsub.getMeshPeers('messages').length
    })
  }
}

emit('started', { peer_id: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) })

const lines = readline.createInterface({ input: process.stdin })
for await (const line of lines) {
  if (!line.trim()) continue
  const command = JSON.parse(line)
  try {
    if (command.op === 'dial') {
      await node.dial(multiaddr(command.addr))
      emit('dialled', { addr: command.addr })
    } else if (command.op === 'publish') {
      await pubsub.publish(command.topic, new TextEncoder().encode(command.text))
      emit('published', { topic: command.topic })
    } else if (command.op === 'aikyo') {
      aikyo.on = true
      aikyo.delay = Number(command.delay_ms ?? 0)
      emit('aikyo_on', { delay_ms: aikyo.delay })
    } else if (typeof command.op === 'string' && command.op.startsWith('bench_')) {
      await benchCommand(command)
    } else if (command.op === 'stop') {
      break
    }
  } catch (err) {
    emit('error', { op: command.op, error: String(err) })
  }
}
await node.stop()
process.exit(0)
