// The companion web page: a Firehose client in plain JavaScript (no build step).
// It shows the conversation, sends what the person writes, answers approval requests and
// voices `speak` queries with the browser's speech synthesis, answering each one when its
// utterance has ended so that turns follow real speech.
// Transport: a WebSocket at once, upgraded to WebRTC when the bridge offers it (the data channel
// carries the same frames; with voice on, the bridge speaks the lines on an audio track and
// answers the speak queries itself). See the "WebRTC" section below and docs/webrtc.md.
// While a companion prepares its reply it says so (`companion.thinking`), and when it cannot
// reply it gives its slot up with a reason (`companion.yield`): the page shows "Juniper is
// thinking… (12 s)" and then the reply, or one line saying why there is none (docs/clients.md).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  const tokenQuery = token ? `?token=${encodeURIComponent(token)}` : "";
  // aikyo's Firehose topics, and `states`: an array that chooses nobody because the stage is
  // `terminal` is how the page learns that the conversation is over.
  const TOPICS = ["messages", "queries", "actions", "states"];
  const wsQuery = new URLSearchParams({ topics: TOPICS.join(",") });
  if (token) wsQuery.set("token", token);
  const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/?${wsQuery}`;

  const EMOTIONS = { happy: "😊 happy", sad: "😢 sad", angry: "😠 angry", neutral: "😐 neutral" };
  const START_HINT =
    "Write below and press Send to talk to every companion, or pick one in “to”; " +
    "“next” nominates who speaks next.";
  const END_MARKER = "— the conversation has ended; write below to start a new one —";
  const REFUSALS = [401, 403, 421]; // the bridge will not take this page as it is: say why, do not retry
  const APPROVAL_TTL_MS = 130000;
  const DIRECTORY_EVERY_MS = 5000;
  const MAX_LINES = 500;
  const THINKING = "companion.thinking";
  const YIELD = "companion.yield";
  const THINKING_DEADLINE_MS = 300000; // a lost reply never leaves an endless "thinking"
  const MAX_THINKERS = 32;
  const MAX_DETAIL = 200;
  const MAX_NAME = 60;
  const REASON_WORDS = {
    model_error: "the model failed",
    timeout: "the model timed out",
    crashed: "it crashed while preparing its reply",
    no_reply: "the model gave no reply",
  };

  const companions = new Map(); // id -> metadata, from the bridge's /companions
  const seen = new Set(); // companion ids seen speaking
  const approvals = new Map(); // query id -> element
  const thinking = new Map(); // companion id -> { inReplyTo, since (performance.now()) }
  const yieldsSeen = new Set(); // "companion id\n message id" of yields shown
  let ended = false; // the end marker is shown for the current conversation
  const answeredHere = new Map(); // approval query id -> what it approved (to explain a late answer)
  let socket = null;
  let retryMs = 500;

  // --- who am I ---------------------------------------------------------------------------
  const meInput = $("me");
  const stored = localStorage.getItem("companion.me");
  meInput.value = params.get("as") || stored || `user_guest${Math.floor(Math.random() * 9000 + 1000)}`;
  const me = () => {
    const value = meInput.value.trim();
    return /^user_[A-Za-z0-9_\-.]+$/.test(value) ? value : "user_guest";
  };
  meInput.addEventListener("change", () => localStorage.setItem("companion.me", me()));

  const voiceMode = $("voice-mode");
  voiceMode.value = params.get("voice") || localStorage.getItem("companion.voice") || "silent";
  voiceMode.addEventListener("change", () => {
    localStorage.setItem("companion.voice", voiceMode.value);
    if (voiceMode.value === "speak" && "speechSynthesis" in window) {
      speechSynthesis.cancel(); // unlock audio on this user gesture
    }
  });

  const newId = () =>
    (window.crypto && crypto.randomUUID)
      ? crypto.randomUUID()
      : `${Date.now().toString(16)}-${Math.random().toString(16).slice(2)}`;

  // This page's session key: sent first on every link (the WebSocket, its reconnections, the
  // WebRTC data channel), so the bridge accepts this page's answers to queries it received on
  // any of them, and nobody else's. Random, kept only in this page's memory.
  const sessionKey = [...crypto.getRandomValues(new Uint8Array(16))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
  const sessionFrame = JSON.stringify({ session: sessionKey });

  const nameOf = (id) => {
    if (id === me()) return "you";
    const meta = companions.get(id);
    if (meta) return meta.name;
    return id.replace(/^(companion_|user_)/, "");
  };

  // Network input on one line: no control or bidi characters, no lone surrogates, bounded.
  // (Shown with textContent, never as HTML.)
  function oneLine(value, limit) {
    const text = String(value)
      .slice(0, limit * 4)
      .replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "")
      .replace(/[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]/g, " ")
      .replace(/\s+/g, " ")
      .trim();
    return text.length <= limit ? text : `${text.slice(0, limit - 1).trimEnd()}…`;
  }

  // --- the transcript ---------------------------------------------------------------------
  const transcript = $("transcript");

  function append(li) {
    const atBottom = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 40;
    transcript.appendChild(li);
    while (transcript.children.length > MAX_LINES) transcript.firstChild.remove();
    if (atBottom) transcript.scrollTop = transcript.scrollHeight;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A line being voiced a sentence at a time (speak queries with `params.metadata.line`) is
  // shown growing until its message.send, which replaces it (docs/clients.md).
  const drafts = new Map(); // companion id -> the li of its line being voiced

  function growDraft(query) {
    const body = query.params.body || {};
    const meta = query.params.metadata !== null && typeof query.params.metadata === "object" ? query.params.metadata : {};
    if (typeof body.message !== "string" || typeof meta.line !== "string") return;
    const from = query.params.from;
    let li = drafts.get(from);
    if (!li || li.dataset.line !== meta.line) {
      if (li) li.remove();
      li = el("li", "draft");
      li.dataset.line = meta.line;
      const head = el("div", "meta");
      head.appendChild(el("span", "from", nameOf(from)));
      li.appendChild(head);
      li.appendChild(el("div", "bubble", ""));
      drafts.set(from, li);
      append(li);
    }
    const bubble = li.querySelector(".bubble");
    bubble.textContent = oneLine(`${bubble.textContent} ${body.message}`, 2000);
  }

  function dropDraft(from) {
    const li = drafts.get(from);
    if (li) li.remove();
    drafts.delete(from);
  }

  function showMessage(p) {
    dropDraft(p.from);
    const metadata = p.metadata !== null && typeof p.metadata === "object" ? p.metadata : {};
    if (p.from.startsWith("companion_")) {
      seen.add(p.from);
      stopThinking(p.from); // its reply, or any word from it, ends its thinking
      if (typeof metadata.in_reply_to !== "string") ended = false; // a companion opens a conversation
    } else {
      ended = false; // a person's message starts a new conversation
    }
    const li = el("li", p.from === me() ? "message mine" : "message");
    li.dataset.id = p.id;
    li.dataset.from = p.from;
    const meta = el("div", "meta");
    meta.appendChild(el("span", "from", nameOf(p.from)));
    meta.appendChild(document.createTextNode(` → ${p.to.map(nameOf).join(", ") || "nobody"}`));
    const emotion = p.metadata && typeof p.metadata.emotion === "string" ? p.metadata.emotion : null;
    if (emotion) meta.appendChild(el("span", `emotion ${emotion}`, EMOTIONS[emotion] || emotion));
    li.appendChild(meta);
    li.appendChild(el("div", "bubble", p.message));
    append(li);
    refreshCompanions();
    if (metadata.closing === "terminal") endConversation();
  }

  function endConversation() {
    clearThinking();
    if (ended) return;
    ended = true;
    showSystem(END_MARKER, "end");
  }

  function markRefused(ref, why) {
    if (typeof ref !== "string") return;
    for (const li of transcript.querySelectorAll("li.message.mine")) {
      if (li.dataset.id !== ref || li.classList.contains("refused")) continue;
      li.classList.add("refused");
      li.appendChild(el("span", "note", `not sent: ${why}`));
    }
  }

  function showSystem(text, kind) {
    append(el("li", `system ${kind || ""}`, text));
  }

  // --- thinking, giving up, the end -------------------------------------------------------
  const thinkingBox = $("thinking");
  let thinkingTimer = null;

  function startThinking(id, inReplyTo) {
    const current = thinking.get(id);
    if (current && current.inReplyTo === inReplyTo) return; // a repeat: the count goes on
    thinking.delete(id);
    thinking.set(id, { inReplyTo, since: performance.now() });
    while (thinking.size > MAX_THINKERS) thinking.delete(thinking.keys().next().value);
    renderThinking();
  }

  function stopThinking(id, inReplyTo) {
    const current = thinking.get(id);
    if (!current || (inReplyTo !== undefined && current.inReplyTo !== inReplyTo)) return;
    thinking.delete(id);
    renderThinking();
  }

  function clearThinking() {
    thinking.clear();
    renderThinking();
  }

  // One line per thinking companion, its seconds counting up; each line's text is set only
  // when it reads differently, so nothing flickers between seconds.
  function renderThinking() {
    const now = performance.now();
    for (const [id, t] of [...thinking]) {
      if (now - t.since >= THINKING_DEADLINE_MS) {
        thinking.delete(id);
        const name = oneLine(nameOf(id), MAX_NAME);
        showSystem(`(no word from ${name} after ${THINKING_DEADLINE_MS / 1000} s of thinking)`);
      }
    }
    const lines = new Map([...thinkingBox.children].map((p) => [p.dataset.id, p]));
    for (const [id, p] of lines) {
      if (!thinking.has(id)) p.remove();
    }
    for (const [id, t] of thinking) {
      let p = lines.get(id);
      if (!p) {
        p = el("p", "");
        p.dataset.id = id;
        thinkingBox.appendChild(p);
      }
      const seconds = Math.max(0, Math.floor((now - t.since) / 1000));
      const text = `${oneLine(nameOf(id), MAX_NAME)} is thinking… (${seconds} s)`;
      if (p.textContent !== text) p.textContent = text;
    }
    thinkingBox.hidden = thinking.size === 0;
    for (const li of $("companions").querySelectorAll("li")) {
      li.classList.toggle("thinking", thinking.has(li.dataset.id));
    }
    if (thinking.size > 0 && thinkingTimer === null) thinkingTimer = setInterval(renderThinking, 250);
    if (thinking.size === 0 && thinkingTimer !== null) {
      clearInterval(thinkingTimer);
      thinkingTimer = null;
    }
  }

  function yieldText(name, reason, detail) {
    if (reason === "terminal") return `${name} has nothing more to say; the turn passes to the next companion`;
    const words = REASON_WORDS[reason] || `it gave up (${oneLine(reason, 40) || "no reason given"})`;
    const shown = typeof detail === "string" ? oneLine(detail, MAX_DETAIL) : "";
    return `${name} could not answer: ${words}${shown ? ` (${shown})` : ""}; the turn passes to the next companion`;
  }

  // Returns whether the action was one of the two signals (shown here, or dropped if malformed).
  function onSignal(p) {
    if (p.name !== THINKING && p.name !== YIELD) return false;
    const args = p.params !== null && typeof p.params === "object" ? p.params : {};
    const inReplyTo = args.in_reply_to;
    const valid = typeof p.from === "string" && p.from.startsWith("companion_") &&
      typeof inReplyTo === "string" && inReplyTo.length > 0 && inReplyTo.length <= 200;
    if (!valid) return true;
    if (p.name === THINKING) {
      startThinking(p.from, inReplyTo);
      return true;
    }
    if (typeof args.reason !== "string") return true;
    stopThinking(p.from, inReplyTo);
    const key = `${p.from}\n${inReplyTo}`;
    if (yieldsSeen.has(key)) return true; // the same yield again
    yieldsSeen.add(key);
    if (yieldsSeen.size > 256) yieldsSeen.delete(yieldsSeen.values().next().value);
    const name = oneLine(nameOf(p.from), MAX_NAME);
    // a terminal yield: this companion's own limit (cards differ); the end is a terminal array
    if (args.reason === "terminal") showSystem(yieldText(name, "terminal"), "over");
    else showSystem(yieldText(name, args.reason, args.detail), "failure");
    return true;
  }

  // The next-speaker rule every node applies to a states array (aikyo's): among companions'
  // states the selected ones, else those that want to speak; the highest importance wins, the
  // earlier on a tie. Nobody speaks when the winner's stage is `terminal`: the conversation ends.
  function endsConversation(states) {
    const valid = states.filter((s) => s !== null && typeof s === "object" && s.params != null &&
      typeof s.params === "object" && typeof s.params.from === "string" &&
      s.params.from.startsWith("companion_") && typeof s.params.importance === "number");
    if (valid.length === 0) return false;
    for (const pool of [valid.filter((s) => s.params.selected === true),
      valid.filter((s) => s.params.state === "speak")]) {
      if (pool.length === 0) continue;
      let best = pool[0];
      for (const s of pool) if (s.params.importance > best.params.importance) best = s;
      return best.params.closing === "terminal";
    }
    return false;
  }

  function showAction(p) {
    if (onSignal(p)) return;
    let text;
    if (p.name === "progress") {
      text = `${nameOf(p.from)}: ${p.params.action || "working"} ${p.params.percent}% ${p.params.message || ""}`;
    } else {
      text = `${nameOf(p.from)}: ${p.name} ${JSON.stringify(p.params)}`;
    }
    append(el("li", "action", `✱ ${text}`));
  }

  // --- companions list and pickers --------------------------------------------------------
  function refreshCompanions() {
    const ids = [...new Set([...companions.keys(), ...seen])];
    const list = $("companions");
    const speaking = new Set([...list.querySelectorAll("li.speaking")].map((li) => li.dataset.id));
    list.replaceChildren();
    if (ids.length === 0) list.appendChild(el("li", "empty", "none connected yet"));
    for (const id of ids) {
      const li = el("li", speaking.has(id) ? "speaking" : "");
      if (thinking.has(id)) li.classList.add("thinking");
      li.dataset.id = id;
      li.appendChild(el("span", "name", nameOf(id)));
      li.appendChild(el("span", "id", id));
      list.appendChild(li);
    }
    for (const select of [$("to"), $("next")]) {
      const chosen = select.value;
      const first = select.options[0];
      select.replaceChildren(first);
      for (const id of ids) {
        const option = el("option", "", nameOf(id));
        option.value = id;
        select.appendChild(option);
      }
      select.value = ids.includes(chosen) ? chosen : "";
    }
  }

  function markSpeaking(id, on) {
    for (const li of $("companions").querySelectorAll("li")) {
      if (li.dataset.id === id) li.classList.toggle("speaking", on);
    }
  }

  async function loadCompanions() {
    try {
      const response = await fetch(`/companions${tokenQuery}`, { cache: "no-store" });
      if (!response.ok) return;
      const data = await response.json();
      companions.clear();
      for (const meta of data.companions) companions.set(meta.id, meta);
      refreshCompanions();
    } catch (err) {
      // the bridge is restarting; the next round tries again
    }
  }

  // --- sending ----------------------------------------------------------------------------
  function send(topic, body) {
    if (!linkOpen()) {
      showSystem("not connected: the frame was not sent", "error");
      return false;
    }
    linkSend(JSON.stringify({ topic, body }));
    return true;
  }

  function answer(queryId, success, body) {
    return send("queries", { jsonrpc: "2.0", id: queryId, result: { success, body } });
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("text");
    const text = input.value.trim();
    if (!text) return;
    const chosen = $("to").value;
    let to = chosen ? [chosen] : [...new Set([...companions.keys(), ...seen])];
    if (to.length === 0) {
      showSystem("no companions known yet: wait for one to join", "error");
      return;
    }
    const params = { id: newId(), from: me(), to, message: text };
    const next = $("next").value;
    if (next) {
      params.metadata = { next_speaker: next };
      if (!to.includes(next)) params.to = to = [...to, next];
    }
    if (send("messages", { jsonrpc: "2.0", method: "message.send", params })) {
      showMessage(params); // the bridge does not echo our own frames back
      input.value = "";
      $("next").value = "";
    }
  });

  // --- speak queries ----------------------------------------------------------------------
  function guessLang(text) {
    if (/[\u3040-\u30ff\u4e00-\u9fff]/.test(text)) return "ja-JP";
    if (/[\uac00-\ud7a3]/.test(text)) return "ko-KR";
    return document.documentElement.lang || "en";
  }

  function speak(query) {
    const body = query.params.body || {};
    const text = typeof body.message === "string" ? body.message : "";
    const mode = voiceMode.value;
    if (mode === "off") return;
    if (bridgeSpeaks(query)) return; // WebRTC voice: the bridge plays it and answers
    if (!text) {
      send("queries", { jsonrpc: "2.0", id: query.id, error: "speak query without a message" });
      return;
    }
    if (mode === "silent" || !("speechSynthesis" in window)) {
      answer(query.id, true, { spoken: false, shown: true });
      return;
    }
    const from = query.params.from;
    const utterance = new SpeechSynthesisUtterance(text);
    utterance.lang = guessLang(text);
    utterance.pitch = body.emotion === "happy" ? 1.2 : body.emotion === "sad" ? 0.85 : 1;
    utterance.rate = body.emotion === "angry" ? 1.15 : 1;
    let settled = false;
    // Every wait has a deadline: an utterance that never reports its end is answered anyway.
    const deadline = setTimeout(() => finish(false, { error: "speech did not finish in time" }), 10000 + text.length * 200);
    function finish(ok, result) {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      markSpeaking(from, false);
      answer(query.id, ok, result);
    }
    utterance.onstart = () => markSpeaking(from, true);
    utterance.onend = () => finish(true, { spoken: true, engine: "speechSynthesis" });
    utterance.onerror = (event) => finish(false, { error: `speech failed: ${event.error || "unknown"}` });
    speechSynthesis.speak(utterance);
  }

  // --- approval queries -------------------------------------------------------------------
  function askApproval(query) {
    const body = query.params.body || {};
    const card = el("div", "approval");
    card.dataset.query = query.id;
    card.appendChild(el("p", "", `${nameOf(query.params.from)} asks to run ${body.action || "an action"}`));
    if (body.description) card.appendChild(el("p", "description", body.description));
    card.appendChild(el("p", "preview", body.preview || JSON.stringify(body.input || {})));
    const decide = (approved) => {
      settleApproval(query.id);
      answeredHere.set(query.id, body.preview || body.action || query.id);
      if (answeredHere.size > 256) answeredHere.delete(answeredHere.keys().next().value);
      const verdict = approved ? "approved" : "denied";
      answer(query.id, true, { approved, reason: `${verdict} in the browser by ${me()}` });
      showSystem(`you ${verdict}: ${body.preview || body.action || query.id}`);
    };
    const yes = el("button", "approve", "Approve");
    yes.type = "button";
    yes.addEventListener("click", () => decide(true));
    const no = el("button", "deny secondary", "Deny");
    no.type = "button";
    no.addEventListener("click", () => decide(false));
    card.appendChild(yes);
    card.appendChild(no);
    $("approvals").appendChild(card);
    approvals.set(query.id, card);
    setTimeout(() => settleApproval(query.id), APPROVAL_TTL_MS);
  }

  function settleApproval(queryId) {
    const card = approvals.get(queryId);
    if (card) {
      card.remove();
      approvals.delete(queryId);
    }
  }

  // --- frames from the bridge ------------------------------------------------------------
  function onFrame(text) {
    if (duplicateAfterUpgrade(text)) return;
    let data;
    try {
      data = JSON.parse(text);
    } catch (err) {
      return;
    }
    if (Array.isArray(data)) {
      if (endsConversation(data)) endConversation(); // states: otherwise not shown
      return;
    }
    if (data === null || typeof data !== "object") return;
    if (data.control !== undefined) {
      onControl(data); // WebRTC session state (data channel only)
      return;
    }
    if (data.error !== undefined && data.jsonrpc === undefined) {
      onError(data.error);
      return;
    }
    switch (data.method) {
      case "message.send":
        showMessage(data.params);
        break;
      case "query.send":
        if (data.params.type === "speak") {
          growDraft(data);
          speak(data);
        }
        else if (data.params.type === "approval") askApproval(data);
        break;
      case "action.send":
        showAction(data.params);
        break;
      default:
        if (data.id !== undefined) {
          settleApproval(data.id); // a result, maybe from another client
          settleVoice(data.id);
        }
    }
  }

  function onError(error) {
    const detail = error !== null && typeof error === "object" ? error : { message: String(error) };
    if (detail.code === "already_answered") {
      // another client answered first: news only if it was an approval given on this page
      const what = answeredHere.get(detail.ref);
      if (what !== undefined) showSystem(`your answer to “${what}” came too late: it was already answered elsewhere`);
      return;
    }
    const text = detail.message || detail.code || "refused";
    markRefused(detail.ref, text);
    showSystem(`bridge: ${text}`, "error");
  }

  function setStatus(state, text) {
    const status = $("status");
    status.dataset.state = state;
    status.textContent = text;
  }

  // Browsers do not tell a page why a WebSocket handshake failed; /companions follows the same
  // rules (host, origin, token), so its answer says whether the bridge refused this page.
  async function refusal() {
    try {
      const response = await fetch(`/companions${tokenQuery}`, { cache: "no-store" });
      if (REFUSALS.includes(response.status)) {
        return { status: response.status, text: (await response.text()).trim() };
      }
    } catch (err) {
      // the bridge is down or restarting: an ordinary disconnection
    }
    return null;
  }

  function showRefusal(refused) {
    if (refused.status === 401) {
      setStatus("refused", token ? "wrong token" : "token needed");
      $("token-why").textContent = token
        ? "The token in this page's address is not this bridge's token. Paste the right one " +
          "(the bridge prints its page address with ?token=... when it starts):"
        : "This bridge needs a token. Open the page address the bridge printed when it started " +
          "(it ends in ?token=...), or paste the token here:";
      $("token-form").hidden = false;
      $("token").focus();
    } else {
      setStatus("refused", `refused (${refused.status})`);
    }
    showSystem(`the bridge refused this page: ${refused.text}`, "error");
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    params.set("token", value);
    location.search = `?${params.toString()}`; // reload with the token in the address
  });

  function connect() {
    setStatus("connecting", "connecting…");
    let opened = false;
    socket = new WebSocket(wsUrl);
    socket.addEventListener("open", () => {
      opened = true;
      socket.send(sessionFrame);
      retryMs = 500;
      setStatus("connected", "connected");
      loadCompanions();
      upgradeToRtc();
    });
    socket.addEventListener("message", (event) => onFrame(event.data));
    socket.addEventListener("close", async (event) => {
      if (rtc) return; // closed on purpose: the conversation continues over WebRTC
      if (!opened) {
        const refused = await refusal();
        if (refused) {
          showRefusal(refused);
          return; // the same request would be refused again: wait for the person
        }
      }
      const why = event.reason ? `: ${event.reason}` : "";
      setStatus("closed", `disconnected${why} — retrying`);
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    });
  }

  // --- WebRTC: data channel for the frames, an audio track for the voice -----------------
  // The page connects over WebSocket first (no wait), then offers WebRTC to the bridge. When
  // the data channel opens, the WebSocket is closed; frames that arrived twice meanwhile are
  // dropped. If WebRTC is not possible (no route for ICE, an older bridge), the WebSocket stays.
  const wantRtc = params.get("transport") !== "ws" && "RTCPeerConnection" in window;
  const RTC_GATHER_MS = 2000;
  const RTC_OPEN_MS = 8000;
  const UPGRADE_DEDUPE_MS = 3000;
  let rtc = null; // { pc, channel, voice }
  let rtcPending = false;
  let dedupeUntil = 0;
  const recentFrames = [];
  const voicePlaying = new Map(); // speak query id -> companion id (the bridge speaks it)
  const voiceAudio = document.createElement("audio");
  voiceAudio.autoplay = true;
  voiceAudio.hidden = true;
  document.body.appendChild(voiceAudio);
  const hush = $("hush");

  function linkOpen() {
    if (rtc) return rtc.channel.readyState === "open";
    return socket !== null && socket.readyState === WebSocket.OPEN;
  }

  function linkSend(text) {
    (rtc ? rtc.channel : socket).send(text);
  }

  function duplicateAfterUpgrade(text) {
    const duplicate = Date.now() < dedupeUntil && recentFrames.includes(text);
    recentFrames.push(text);
    if (recentFrames.length > 200) recentFrames.shift();
    return duplicate;
  }

  function transportLabel() {
    if (!rtc) return "connected";
    return rtc.voice ? "connected · WebRTC · voice" : "connected · WebRTC";
  }

  function showTransport() {
    $("status").dataset.transport = rtc ? "webrtc" : "websocket";
    if (linkOpen()) setStatus("connected", transportLabel());
    if (hush) hush.hidden = !(rtc && rtc.voice);
  }

  function bridgeSpeaks(query) {
    if (!rtc || !rtc.voice || voiceMode.value !== "speak") return false;
    voicePlaying.set(query.id, query.params.from);
    markSpeaking(query.params.from, true);
    return true;
  }

  function settleVoice(queryId) {
    const from = voicePlaying.get(queryId);
    if (from === undefined) return;
    voicePlaying.delete(queryId);
    if (![...voicePlaying.values()].includes(from)) markSpeaking(from, false);
  }

  function onControl(data) {
    if (data.control === "voice" && rtc) {
      rtc.voice = data.enabled === true;
      showTransport();
    }
  }

  function waitEvent(target, name, ready, ms, what) {
    return new Promise((resolve, reject) => {
      if (ready()) { resolve(); return; }
      const timer = setTimeout(() => { target.removeEventListener(name, check); reject(new Error(`${what} timed out`)); }, ms);
      function check() {
        if (!ready()) return;
        clearTimeout(timer);
        target.removeEventListener(name, check);
        resolve();
      }
      target.addEventListener(name, check);
    });
  }

  async function openRtc() {
    const pc = new RTCPeerConnection();
    try {
      const channel = pc.createDataChannel("firehose");
      channel.addEventListener("message", (event) => onFrame(event.data));
      pc.addTransceiver("audio", { direction: "recvonly" });
      pc.addEventListener("track", (event) => {
        voiceAudio.srcObject = event.streams[0] || new MediaStream([event.track]);
        voiceAudio.play().catch(() => {}); // may wait for a click (autoplay rules)
      });
      await pc.setLocalDescription(await pc.createOffer());
      // one request, one answer: send the candidates gathered so far (all, on a LAN)
      await waitEvent(pc, "icegatheringstatechange", () => pc.iceGatheringState === "complete", RTC_GATHER_MS, "ICE gathering").catch(() => {});
      const response = await fetch(`/webrtc/offer${tokenQuery}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
          type: "offer", sdp: pc.localDescription.sdp, voice: voiceMode.value === "speak", topics: TOPICS,
        }),
      });
      const reply = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(reply.error ? reply.error.message : `HTTP ${response.status}`);
      await pc.setRemoteDescription({ type: "answer", sdp: reply.sdp });
      await waitEvent(channel, "open", () => channel.readyState === "open", RTC_OPEN_MS, "data channel");
      channel.send(sessionFrame);
      return { pc, channel, voice: reply.voice === true };
    } catch (err) {
      pc.close();
      throw err;
    }
  }

  async function upgradeToRtc() {
    if (!wantRtc || rtc || rtcPending) return;
    rtcPending = true;
    try {
      const session = await openRtc();
      rtc = session;
      dedupeUntil = Date.now() + UPGRADE_DEDUPE_MS;
      const old = socket;
      socket = null;
      if (old) old.close(1000, "switched to WebRTC");
      showTransport();
      const lost = () => {
        if (rtc !== session) return;
        rtc = null;
        session.pc.close();
        for (const id of [...voicePlaying.keys()]) settleVoice(id);
        showTransport();
        setStatus("closed", "disconnected — retrying");
        setTimeout(connect, retryMs);
      };
      session.channel.addEventListener("close", lost);
      session.pc.addEventListener("connectionstatechange", () => {
        if (["failed", "closed"].includes(session.pc.connectionState)) lost();
      });
    } catch (err) {
      showSystem(`WebRTC unavailable (${err.message}); staying on WebSocket`);
      showTransport();
    } finally {
      rtcPending = false;
    }
  }

  voiceMode.addEventListener("change", () => {
    if (voiceMode.value === "speak") voiceAudio.play().catch(() => {}); // a click unlocks audio
    if (rtc) linkSend(JSON.stringify({ control: "voice", enabled: voiceMode.value === "speak" }));
  });

  if (hush) {
    hush.addEventListener("click", () => {
      if (rtc) linkSend(JSON.stringify({ control: "stop" }));
    });
  }

  // leaving the page ends the session at once (otherwise the bridge waits for consent to expire)
  window.addEventListener("pagehide", () => {
    if (rtc) rtc.pc.close();
  });

  window.companionLink = {
    transport: () => (rtc ? "webrtc" : socket ? "websocket" : "none"),
    peerConnection: () => (rtc ? rtc.pc : null),
  };

  showSystem(START_HINT, "hint");
  connect();
  setInterval(loadCompanions, DIRECTORY_EVERY_MS);
})();
