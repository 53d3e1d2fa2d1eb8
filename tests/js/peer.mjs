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

const METADATA_PROTOCOL = '/aikyo/metadata/1.0.0'
const TOPICS = ['messages', 'states', 'queries', 'actions']
const me = JSON.parse(process.argv[2])
const known = new Map() // peer id -> metadata, as aikyo keeps its companion list

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

// Like aikyo: a peer already known gets an empty answer.
await node.handle(METADATA_PROTOCOL, async ({ stream, connection }) => {
  if (known.has(connection.remotePeer.toString())) {
    await stream.close()
    return
  }
  await stream.sink([new TextEncoder().encode(JSON.stringify(me))])
  await stream.close()
})

// Like aikyo: ask a peer for its metadata once identify has run, keep only the first chunk.
node.addEventListener('peer:identify', async (evt) => {
  const peer = evt.detail.peerId
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
    emit('metadata_error', { peer: id, error: String(err) })
  }
})

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
  emit('message', {
    topic: msg.topic,
    from: msg.from.toString(),
    seqno: msg.sequenceNumber.toString(),
    msgId: evt.detail.msgId,
    text: new TextDecoder().decode(msg.data)
  })
})
for (const topic of TOPICS) pubsub.subscribe(topic)

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
    } else if (command.op === 'stop') {
      break
    }
  } catch (err) {
    emit('error', { op: command.op, error: String(err) })
  }
}
await node.stop()
process.exit(0)
