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

  // --- the page's own words, in English and Japanese (the browser's language picks; ?lang=) --
  const TEXT = {
    en: {
      companions: "Companions", settings: "Settings", stop: "Stop",
      stopTitle: "Stop the conversation: every companion ends it now",
      token: "token", connect: "Connect", youAre: "you are", voice: "voice",
      voiceSpeak: "speak aloud", voiceSilent: "answer silently", voiceOff: "leave to other clients",
      rate: "speech rate", pace: "pause after each voiced line", export: "export",
      stopVoice: "stop voice", noneYet: "none connected yet", to: "to", next: "next",
      everyone: "everyone", anyone: "anyone", placeholder: "Say something to the companions…",
      send: "Send", personality: "Personality", story: "Story", sample: "How it talks",
      tools: "Tools", noTools: "none announced", mute: "mute on this page", close: "Close",
      startHint:
        "Write below and press Send to talk to every companion, or pick one in “to”; " +
        "“next” nominates who speaks next.",
      endMarker: "— the conversation has ended; write below to start a new one —",
      stopMessage: "Let's stop here.",
      youStopped: "you stopped the conversation",
      theyStopped: "{name} stopped the conversation",
      nothingToStop: "no conversation to stop",
      earlier: "earlier messages",
      emotions: { happy: "😊 happy", sad: "😢 sad", angry: "😠 angry", neutral: "😐 neutral" },
      you: "you", nobody: "nobody", muted: "muted", speaking: "speaking",
      thinking: "{name} is thinking… ({s} s)",
      noWord: "(no word from {name} after {s} s of thinking)",
      passes: "the turn passes to the next companion",
      nothingMore: "{name} has nothing more to say; the turn passes to the next companion",
      couldNot: "{name} could not answer: {words}{detail}; the turn passes to the next companion",
      reasons: {
        model_error: "the model failed",
        timeout: "the model timed out",
        crashed: "it crashed while preparing its reply",
        no_reply: "the model gave no reply",
        stopping: "it is stopping",
      },
      gaveUp: "it gave up ({reason})", noReason: "no reason given",
      connecting: "connecting…", connected: "connected", retrying: "disconnected{why} — retrying",
      notConnected: "not connected: the frame was not sent",
      noCompanions: "no companions known yet: wait for one to join",
      asksToRun: "{name} asks to run {action}", anAction: "an action",
      approve: "Approve", deny: "Deny", youDecided: "you {verdict}: {what}",
      approved: "approved", denied: "denied",
      tooLate: "your answer to “{what}” came too late: it was already answered elsewhere",
      notSent: "not sent: {why}", bridgeSays: "bridge: {text}",
      tokenNeeded: "token needed", wrongToken: "wrong token", refusedStatus: "refused ({status})",
      wrongTokenWhy:
        "The token in this page's address is not this bridge's token. Paste the right one " +
        "(the bridge prints its page address with ?token=... when it starts):",
      tokenWhy:
        "This bridge needs a token. Open the page address the bridge printed when it started " +
        "(it ends in ?token=...), or paste the token here:",
      refusedPage: "the bridge refused this page: {text}",
      rtcUnavailable: "WebRTC unavailable ({error}); staying on WebSocket",
    },
    ja: {
      companions: "コンパニオン", settings: "設定", stop: "終了",
      stopTitle: "会話を終わらせる(すべてのコンパニオンがここで終えます)",
      token: "トークン", connect: "接続", youAre: "あなたのID", voice: "音声",
      voiceSpeak: "読み上げる", voiceSilent: "読み上げずに応答", voiceOff: "他のクライアントに任せる",
      rate: "話す速さ", pace: "読み上げ後の間", export: "書き出し",
      stopVoice: "音声を止める", noneYet: "まだ誰も接続していません", to: "宛先", next: "次の話者",
      everyone: "全員", anyone: "指定なし", placeholder: "コンパニオンに話しかけましょう…",
      send: "送信", personality: "性格", story: "生い立ち", sample: "話し方",
      tools: "ツール", noTools: "未公開", mute: "このページでミュート", close: "閉じる",
      startHint:
        "下に書いて「送信」を押すと全員に話しかけます。「宛先」で一人を選び、" +
        "「次の話者」で次に話す人を指名できます。",
      endMarker: "— 会話が終わりました。下に書くと新しい会話が始まります —",
      stopMessage: "ここで終わりにしましょう。",
      youStopped: "あなたが会話を終わらせました",
      theyStopped: "{name}さんが会話を終わらせました",
      nothingToStop: "終わらせる会話がありません",
      earlier: "これまでのメッセージ",
      emotions: { happy: "😊 うれしい", sad: "😢 かなしい", angry: "😠 怒り", neutral: "😐 ふつう" },
      you: "あなた", nobody: "なし", muted: "ミュート中", speaking: "話しています",
      thinking: "{name}が考え中…({s}秒)",
      noWord: "({name}は{s}秒考えても応答がありませんでした)",
      passes: "次のコンパニオンに順番が移ります",
      nothingMore: "{name}はもう話すことがありません。次のコンパニオンに順番が移ります",
      couldNot: "{name}は答えられませんでした:{words}{detail}。次のコンパニオンに順番が移ります",
      reasons: {
        model_error: "モデルのエラー",
        timeout: "モデルの時間切れ",
        crashed: "返答の準備中に異常終了",
        no_reply: "モデルが返答しませんでした",
        stopping: "停止中です",
      },
      gaveUp: "断念({reason})", noReason: "理由なし",
      connecting: "接続中…", connected: "接続済み", retrying: "切断されました{why}。再接続中",
      notConnected: "接続されていないため送信できませんでした",
      noCompanions: "まだコンパニオンがいません。参加を待ってください",
      asksToRun: "{name}が「{action}」の実行を求めています", anAction: "操作",
      approve: "許可", deny: "拒否", youDecided: "{verdict}しました:{what}",
      approved: "許可", denied: "拒否",
      tooLate: "「{what}」への応答は間に合いませんでした(他で応答済み)",
      notSent: "未送信:{why}", bridgeSays: "ブリッジ:{text}",
      tokenNeeded: "トークンが必要", wrongToken: "トークンが違います", refusedStatus: "拒否されました({status})",
      wrongTokenWhy:
        "このページのアドレスのトークンはこのブリッジのものではありません。正しいトークンを貼り付けてください" +
        "(ブリッジは起動時に ?token=... 付きのアドレスを表示します):",
      tokenWhy:
        "このブリッジにはトークンが必要です。ブリッジが起動時に表示したアドレス(?token=... で終わる)を" +
        "開くか、ここにトークンを貼り付けてください:",
      refusedPage: "ブリッジがこのページを拒否しました:{text}",
      rtcUnavailable: "WebRTC は使えません({error})。WebSocket のまま続けます",
    },
  };
  const LANG = (() => {
    const wanted = [params.get("lang"), ...(navigator.languages || []), navigator.language];
    for (const tag of wanted) {
      if (typeof tag !== "string") continue;
      const base = tag.toLowerCase().split("-")[0];
      if (base in TEXT) return base;
    }
    return "en";
  })();
  const WORDS = TEXT[LANG];
  // t("thinking", { name: "Pim", s: 3 }): this language's words with the values put in
  function t(key, values) {
    const text = WORDS[key] ?? TEXT.en[key] ?? key;
    if (!values) return text;
    return text.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
  }

  function translatePage() {
    document.documentElement.lang = LANG;
    for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
    for (const node of document.querySelectorAll("[data-i18n-placeholder]")) {
      node.placeholder = t(node.dataset.i18nPlaceholder);
    }
    for (const node of document.querySelectorAll("[data-i18n-title]")) node.title = t(node.dataset.i18nTitle);
    for (const node of document.querySelectorAll("[data-i18n-label]")) {
      node.setAttribute("aria-label", t(node.dataset.i18nLabel));
      node.title = t(node.dataset.i18nLabel);
    }
  }
  translatePage();

  const EMOTIONS = WORDS.emotions;
  const START_HINT = t("startHint");
  const END_MARKER = t("endMarker");
  const REFUSALS = [401, 403, 421]; // the bridge will not take this page as it is: say why, do not retry
  const APPROVAL_TTL_MS = 130000;
  const DIRECTORY_EVERY_MS = 5000;
  const MAX_LINES = 500;
  const HISTORY_LINES = 200; // asked of the bridge's /history on every connection
  const INTERNAL = "companion."; // the network's own actions (signals, tool lists): never chat lines
  const TOOLS = "companion.tools";
  const THINKING = "companion.thinking";
  const YIELD = "companion.yield";
  const THINKING_DEADLINE_MS = 300000; // a lost reply never leaves an endless "thinking"
  const MAX_THINKERS = 32;
  const MAX_DETAIL = 200;
  const MAX_NAME = 60;
  const MAX_TOOLS = 64;
  const REASON_WORDS = WORDS.reasons;

  const companions = new Map(); // id -> metadata, from the bridge's /companions
  const faces = new Map(); // id -> { color, image }, from the bridge's /appearance
  const toolsOf = new Map(); // id -> [{ id, description }], from its companion.tools announcements
  const seen = new Set(); // companion ids seen speaking
  const approvals = new Map(); // query id -> element
  const thinking = new Map(); // companion id -> { inReplyTo, since (performance.now()) }
  const yieldsSeen = new Set(); // "companion id\n message id" of yields shown
  const lines = new Map(); // message id -> { params, at (ms since the epoch) }: the transcript's messages
  const muted = new Set((() => {
    try {
      const saved = JSON.parse(localStorage.getItem("companion.muted") || "[]");
      return Array.isArray(saved) ? saved.filter((x) => typeof x === "string").slice(0, 256) : [];
    } catch (err) {
      return []; // another version's setting: start with nobody muted
    }
  })());
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

  // Speech rate, and the pause after each voiced line before its companion is told it was
  // said: companions that voice their lines (speak_with_voice) wait for it, so this paces them.
  function slider(id, key, show) {
    const input = $(id);
    const saved = Number(params.get(key) ?? localStorage.getItem(`companion.${key}`));
    if (Number.isFinite(saved) && saved >= Number(input.min) && saved <= Number(input.max)) input.value = String(saved);
    const out = $(`${id}-value`);
    const update = () => { out.textContent = show(Number(input.value)); };
    input.addEventListener("input", () => {
      update();
      localStorage.setItem(`companion.${key}`, input.value);
    });
    update();
    return () => Number(input.value);
  }
  const speechRate = slider("rate", "rate", (v) => `${v.toFixed(1)}×`);
  const pace = slider("pace", "pace", (v) => `${v} s`);

  function toggle(button, panel, open) {
    const show = open ?? panel.hidden;
    panel.hidden = !show;
    button.setAttribute("aria-expanded", String(show));
  }
  $("settings-toggle").addEventListener("click", () => toggle($("settings-toggle"), $("settings")));

  // Narrow screens: the companion list is a drawer over the conversation.
  function setDrawer(open) {
    document.body.classList.toggle("drawer-open", open);
    $("scrim").hidden = !open;
    $("drawer-toggle").setAttribute("aria-expanded", String(open));
  }
  $("drawer-toggle").addEventListener("click", () => setDrawer(!document.body.classList.contains("drawer-open")));
  $("scrim").addEventListener("click", () => setDrawer(false));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") setDrawer(false);
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
    if (id === me()) return t("you");
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
  // Every line carries its time (data-at, ms since the epoch) and lines stay in time order:
  // the bridge's history (older lines) may arrive after live ones.
  const transcript = $("transcript");
  const clock = new Intl.DateTimeFormat(LANG, { hour: "2-digit", minute: "2-digit" });
  const dayAndClock = new Intl.DateTimeFormat(LANG, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  const fullTime = new Intl.DateTimeFormat(LANG, { dateStyle: "full", timeStyle: "medium" });

  function append(li, at = Date.now()) {
    li.dataset.at = String(at);
    const atBottom = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 40;
    const last = transcript.lastElementChild;
    if (!last || Number(last.dataset.at) <= at) {
      transcript.appendChild(li);
    } else {
      const later = [...transcript.children].find((other) => Number(other.dataset.at) > at);
      transcript.insertBefore(li, later || null);
    }
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

  function timeEl(at) {
    const when = new Date(at);
    const today = new Date().toDateString() === when.toDateString();
    const node = el("time", "", (today ? clock : dayAndClock).format(when));
    node.dateTime = when.toISOString();
    node.title = fullTime.format(when);
    return node;
  }

  const lastAt = () => Number(transcript.lastElementChild?.dataset.at ?? 0);

  // A person's message with closing "terminal" is a stop (docs/clients.md): shown as a line
  function isStop(p, metadata) {
    return !p.from.startsWith("companion_") && metadata.closing === "terminal";
  }

  // ``at``: when it was said (ms; live lines: now). ``live``: it just arrived (not history).
  function showMessage(p, at = Date.now(), live = true) {
    dropDraft(p.from); // the line voiced a sentence at a time is whole now
    if (lines.has(p.id)) return; // from the history and live, or after a reconnection
    lines.set(p.id, { params: p, at });
    while (lines.size > MAX_LINES * 2) lines.delete(lines.keys().next().value);
    const metadata = p.metadata !== null && typeof p.metadata === "object" ? p.metadata : {};
    const newest = live || at >= lastAt();
    if (p.from.startsWith("companion_")) {
      seen.add(p.from);
      if (live) stopThinking(p.from); // its reply, or any word from it, ends its thinking
      if (newest && typeof metadata.in_reply_to !== "string") ended = false; // a companion opens a conversation
    } else if (newest) {
      ended = false; // a person's message starts a new conversation
    }
    if (isStop(p, metadata)) {
      const who = p.from === me() ? t("youStopped") : t("theyStopped", { name: oneLine(nameOf(p.from), MAX_NAME) });
      const li = el("li", "system stopped", who);
      li.dataset.id = p.id;
      li.dataset.from = p.from;
      li.appendChild(timeEl(at));
      append(li, at);
    } else {
      append(messageLine(p, metadata, at), at);
    }
    refreshCompanions();
    updateStop();
    // a companion's reply to people alone opens no turn: over, unless another is still at work
    const toPeopleOnly = p.from.startsWith("companion_") && typeof metadata.in_reply_to === "string" &&
      !p.to.some((id) => id.startsWith("companion_"));
    if (newest && (metadata.closing === "terminal" || (toPeopleOnly && thinking.size === 0))) endConversation(at);
    // in the history, the states arrays are missing: a reply stamped "closing" was the last one
    // (the stage after it is terminal), so the end goes right after it
    else if (!live && newest && p.from.startsWith("companion_") && metadata.closing === "closing") endConversation(at + 1);
  }

  function messageLine(p, metadata, at) {
    const li = el("li", p.from === me() ? "message mine" : "message");
    li.dataset.id = p.id;
    li.dataset.from = p.from;
    if (muted.has(p.from)) li.classList.add("muted");
    li.appendChild(faceEl(p.from, "small"));
    const body = el("div", "body");
    const meta = el("div", "meta");
    meta.appendChild(el("span", "from", nameOf(p.from)));
    meta.appendChild(document.createTextNode(` → ${p.to.map(nameOf).join(", ") || t("nobody")}`));
    const emotion = typeof metadata.emotion === "string" ? metadata.emotion : null;
    if (emotion) meta.appendChild(el("span", `emotion ${emotion}`, EMOTIONS[emotion] || emotion));
    meta.appendChild(timeEl(at));
    body.appendChild(meta);
    body.appendChild(el("div", "bubble", p.message));
    li.appendChild(body);
    return li;
  }

  function endConversation(at = Date.now()) {
    clearThinking();
    if (ended) return;
    ended = true;
    showSystem(END_MARKER, "end", at);
    updateStop();
  }

  // Stop is for a conversation under way: off before the first line and after the end.
  function updateStop() {
    $("stop").disabled = ended || lines.size === 0;
  }

  function markRefused(ref, why) {
    if (typeof ref !== "string") return;
    for (const li of transcript.querySelectorAll("li.message.mine")) {
      if (li.dataset.id !== ref || li.classList.contains("refused")) continue;
      li.classList.add("refused");
      li.appendChild(el("span", "note", t("notSent", { why })));
    }
  }

  function showSystem(text, kind, at = Date.now()) {
    append(el("li", `system ${kind || ""}`, text), at);
  }

  // The recent conversation, from the companions' stores through the bridge (companion run
  // --ws): on every connection, so a reload, a second tab or a late joiner sees what was said.
  // A bridge without it (companion bridge alone) answers 404: live lines only.
  function validMessage(p) {
    return p !== null && typeof p === "object" && typeof p.id === "string" && typeof p.from === "string" &&
      Array.isArray(p.to) && p.to.every((x) => typeof x === "string") && typeof p.message === "string";
  }

  async function loadHistory() {
    try {
      const query = new URLSearchParams({ limit: String(HISTORY_LINES) });
      if (token) query.set("token", token);
      const response = await fetch(`/history?${query}`, { cache: "no-store" });
      if (!response.ok) return;
      const data = await response.json();
      const items = data !== null && typeof data === "object" && Array.isArray(data.messages) ? data.messages : [];
      for (const item of items.slice(-HISTORY_LINES)) {
        const p = item !== null && typeof item === "object" && item.message ? item.message.params : null;
        if (!validMessage(p)) continue;
        const at = typeof item.at === "number" && Number.isFinite(item.at) ? item.at * 1000 : 0;
        showMessage(p, at, false);
      }
    } catch (err) {
      // the bridge is restarting: the next connection asks again
    }
  }

  // --- export -------------------------------------------------------------------------------
  function exported(format) {
    const items = [...lines.values()].sort((a, b) => a.at - b.at);
    if (format === "json") {
      const messages = items.map(({ params: p, at }) => ({
        at: new Date(at).toISOString(), id: p.id, from: p.from, from_name: nameOf(p.from), to: p.to,
        message: p.message, metadata: p.metadata ?? null,
      }));
      return JSON.stringify({ exported_at: new Date().toISOString(), companions: Object.fromEntries(companions), messages }, null, 2);
    }
    const out = [`# ${document.title} — ${fullTime.format(new Date())}`, ""];
    for (const { params: p, at } of items) {
      const metadata = p.metadata !== null && typeof p.metadata === "object" ? p.metadata : {};
      const when = new Date(at).toISOString().replace("T", " ").slice(0, 19);
      if (isStop(p, metadata)) {
        out.push(`*${when} ${p.from === me() ? t("youStopped") : t("theyStopped", { name: nameOf(p.from) })}*`, "");
        continue;
      }
      const mood = typeof metadata.emotion === "string" ? ` (${metadata.emotion})` : "";
      const to = p.to.map(nameOf).join(", ") || t("nobody");
      out.push(`**${nameOf(p.from)}** → ${to}${mood} · ${when}`, "", p.message.replace(/\n/g, "  \n"), "");
    }
    return out.join("\n");
  }

  function download(format) {
    const blob = new Blob([exported(format)], { type: format === "json" ? "application/json" : "text/markdown" });
    const link = el("a");
    link.href = URL.createObjectURL(blob);
    link.download = `conversation-${new Date().toISOString().slice(0, 19).replace(/:/g, "")}.${format === "json" ? "json" : "md"}`;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }
  $("export-md").addEventListener("click", () => download("md"));
  $("export-json").addEventListener("click", () => download("json"));

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
    for (const [id, since] of [...thinking]) {
      if (now - since.since >= THINKING_DEADLINE_MS) {
        thinking.delete(id);
        const name = oneLine(nameOf(id), MAX_NAME);
        showSystem(t("noWord", { name, s: THINKING_DEADLINE_MS / 1000 }));
      }
    }
    const lines = new Map([...thinkingBox.children].map((p) => [p.dataset.id, p]));
    for (const [id, p] of lines) {
      if (!thinking.has(id)) p.remove();
    }
    for (const [id, since] of thinking) {
      let p = lines.get(id);
      if (!p) {
        p = el("p", "");
        p.dataset.id = id;
        thinkingBox.appendChild(p);
      }
      const seconds = Math.max(0, Math.floor((now - since.since) / 1000));
      const text = t("thinking", { name: oneLine(nameOf(id), MAX_NAME), s: seconds });
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
    if (reason === "terminal") return t("nothingMore", { name });
    const words = REASON_WORDS[reason] || t("gaveUp", { reason: oneLine(reason, 40) || t("noReason") });
    const shown = typeof detail === "string" ? oneLine(detail, MAX_DETAIL) : "";
    return t("couldNot", { name, words, detail: shown ? ` (${shown})` : "" });
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

  // Conversation, not protocol: the network's own actions (``companion.*``: the thinking and
  // yield signals, tool lists, whatever comes next) never become chat lines. A companion's tool
  // list goes to its profile. Other actions (a tool's gesture, progress) are one plain line.
  function showAction(p) {
    if (typeof p.name !== "string" || typeof p.from !== "string") return;
    if (onSignal(p)) return;
    if (p.name === TOOLS) {
      noteTools(p);
      return;
    }
    if (p.name.startsWith(INTERNAL)) return;
    const args = p.params !== null && typeof p.params === "object" ? p.params : {};
    let text;
    if (p.name === "progress") {
      text = `${nameOf(p.from)}: ${oneLine(args.action || "working", 60)} ${Number(args.percent) || 0}% ${oneLine(args.message || "", 200)}`;
    } else {
      const shown = Object.entries(args).slice(0, 6)
        .map(([key, value]) => `${oneLine(key, 30)}: ${oneLine(typeof value === "string" ? value : JSON.stringify(value), 60)}`);
      text = `${nameOf(p.from)}: ${oneLine(p.name, 60)}${shown.length ? ` (${shown.join(", ")})` : ""}`;
    }
    append(el("li", "action", `✱ ${text.trim()}`));
  }

  function noteTools(p) {
    if (!p.from.startsWith("companion_") || p.params === null || typeof p.params !== "object") return;
    const tools = Array.isArray(p.params.tools) ? p.params.tools : [];
    toolsOf.set(p.from, tools.slice(0, MAX_TOOLS)
      .filter((tool) => tool !== null && typeof tool === "object" && typeof tool.id === "string")
      .map((tool) => ({ id: oneLine(tool.id, 80), description: oneLine(tool.description || "", 300) })));
    if (profile.open && profile.dataset.id === p.from) openProfile(p.from);
  }

  // --- faces ----------------------------------------------------------------------------------
  // A card's appearance (image, colour) from the bridge's /appearance; otherwise initials on a
  // colour of the id's own, the same on every page.
  function colourOf(id) {
    const face = faces.get(id);
    if (face && typeof face.color === "string" && /^#[0-9a-fA-F]{6}$/.test(face.color)) return face.color;
    let hash = 0;
    for (const ch of id) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
    return id.startsWith("companion_") ? `hsl(${hash % 360} 45% 42%)` : "hsl(200 8% 55%)";
  }

  function initials(name) {
    const words = String(name).trim().split(/\s+/).filter(Boolean);
    const first = [...(words[0] || "?")][0];
    const second = words.length > 1 ? [...words[1]][0] : "";
    return (first + second).toUpperCase();
  }

  function faceEl(id, size) {
    const face = el("button", `face ${size || ""}`.trim());
    face.type = "button";
    face.dataset.id = id;
    face.style.background = colourOf(id);
    face.setAttribute("aria-label", nameOf(id));
    const image = faces.get(id)?.image;
    if (typeof image === "string" && /^(\/faces\/|https:\/\/)/.test(image)) {
      const img = el("img");
      img.alt = "";
      img.src = image.startsWith("/") ? `${image}${tokenQuery}` : image;
      img.addEventListener("error", () => { img.remove(); face.textContent = initials(nameOf(id)); });
      face.appendChild(img);
    } else {
      face.textContent = initials(nameOf(id));
    }
    return face;
  }

  async function loadAppearance() {
    try {
      const response = await fetch(`/appearance${tokenQuery}`, { cache: "no-store" });
      if (!response.ok) return; // no cards here (companion bridge alone): initials
      const data = await response.json();
      const listed = data !== null && typeof data === "object" && data.companions !== null &&
        typeof data.companions === "object" ? data.companions : {};
      faces.clear();
      for (const [id, face] of Object.entries(listed).slice(0, 256)) {
        if (face !== null && typeof face === "object") faces.set(id, face);
      }
      refreshCompanions();
      for (const old of transcript.querySelectorAll("li.message .face")) old.replaceWith(faceEl(old.dataset.id, "small"));
    } catch (err) {
      // the bridge is restarting
    }
  }

  // --- the profile: personality, story, tools; mute -----------------------------------------
  const profile = $("profile");

  function openProfile(id) {
    const meta = companions.get(id) || { id, name: nameOf(id), personality: "", story: "", sample: "" };
    profile.dataset.id = id;
    $("profile-face").replaceWith(Object.assign(faceEl(id, "big"), { id: "profile-face" }));
    $("profile-name").textContent = meta.name;
    $("profile-id").textContent = id;
    $("profile-personality").textContent = meta.personality || "—";
    $("profile-story").textContent = meta.story || "—";
    $("profile-sample").textContent = meta.sample ? `“${meta.sample}”` : "—";
    const list = $("profile-tools");
    list.replaceChildren();
    const tools = toolsOf.get(id) || [];
    if (tools.length === 0) list.appendChild(el("li", "muted", t("noTools")));
    for (const tool of tools) {
      const li = el("li");
      li.appendChild(el("strong", "", tool.id));
      if (tool.description) li.appendChild(document.createTextNode(` — ${tool.description}`));
      list.appendChild(li);
    }
    $("profile-mute").checked = muted.has(id);
    if (!profile.open) profile.showModal();
  }

  $("profile-mute").addEventListener("change", () => setMuted(profile.dataset.id, $("profile-mute").checked));

  function setMuted(id, on) {
    if (on) muted.add(id);
    else muted.delete(id);
    localStorage.setItem("companion.muted", JSON.stringify([...muted]));
    for (const li of transcript.querySelectorAll("li.message")) {
      if (li.dataset.from === id) li.classList.toggle("muted", on);
    }
    refreshCompanions();
  }

  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target.closest(".face, #companions li[data-id]") : null;
    if (!target || target.id === "profile-face" || !target.dataset.id?.startsWith("companion_")) return;
    setDrawer(false);
    openProfile(target.dataset.id);
  });

  // --- companions list and pickers --------------------------------------------------------
  function refreshCompanions() {
    const ids = [...new Set([...companions.keys(), ...seen])];
    const list = $("companions");
    const speaking = new Set([...list.querySelectorAll("li.speaking")].map((li) => li.dataset.id));
    list.replaceChildren();
    if (ids.length === 0) list.appendChild(el("li", "empty", t("noneYet")));
    for (const id of ids) {
      const li = el("li", speaking.has(id) ? "speaking" : "");
      if (thinking.has(id)) li.classList.add("thinking");
      if (muted.has(id)) li.classList.add("muted");
      li.dataset.id = id;
      li.appendChild(faceEl(id));
      const who = el("span", "who");
      who.appendChild(el("span", "name", nameOf(id)));
      who.appendChild(el("span", "id", id));
      const state = speaking.has(id) ? t("speaking") : muted.has(id) ? t("muted") : "";
      who.appendChild(el("span", "state", state));
      li.appendChild(who);
      list.appendChild(li);
    }
    $("drawer-count").textContent = ids.length ? String(ids.length) : "";
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

  // The speaking indicator: while a line is voiced (here, or by the bridge over WebRTC) its
  // companion's face pulses and the line shows above the composer.
  const speakingBox = $("speaking");
  const speakingNow = new Map(); // companion id -> the line being voiced

  function markSpeaking(id, on, text) {
    if (on) speakingNow.set(id, typeof text === "string" ? text : speakingNow.get(id) || "");
    else speakingNow.delete(id);
    for (const li of $("companions").querySelectorAll("li")) {
      if (li.dataset.id !== id) continue;
      li.classList.toggle("speaking", on);
      const state = li.querySelector(".state");
      if (state) state.textContent = on ? t("speaking") : muted.has(id) ? t("muted") : "";
    }
    speakingBox.replaceChildren(...[...speakingNow].map(([who, line]) =>
      el("p", "", `${oneLine(nameOf(who), MAX_NAME)}${line ? `: ${oneLine(line, 160)}` : ""}`)));
    speakingBox.hidden = speakingNow.size === 0;
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
      showSystem(t("notConnected"), "error");
      return false;
    }
    linkSend(JSON.stringify({ topic, body }));
    return true;
  }

  function answer(queryId, success, body) {
    return send("queries", { jsonrpc: "2.0", id: queryId, result: { success, body } });
  }

  // A voiced line is reported after the pause the person chose (the pace setting): companions
  // that voice their lines wait for the report before the conversation goes on.
  function answerSpoken(queryId, success, body) {
    const pause = pace() * 1000;
    if (pause <= 0) return answer(queryId, success, body);
    setTimeout(() => answer(queryId, success, body), pause);
    return true;
  }

  // Stop: the person closes the conversation (``closing: terminal`` in the message's metadata,
  // aikyo's wire; our companions end it at once, docs/clients.md). Every companion known is told.
  $("stop").addEventListener("click", () => {
    const to = [...new Set([...companions.keys(), ...seen])];
    if (to.length === 0) {
      showSystem(t("noCompanions"), "error");
      return;
    }
    const params = { id: newId(), from: me(), to, message: t("stopMessage"), metadata: { closing: "terminal" } };
    if (send("messages", { jsonrpc: "2.0", method: "message.send", params })) {
      if ("speechSynthesis" in window) speechSynthesis.cancel();
      showMessage(params);
    }
  });

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("text");
    const text = input.value.trim();
    if (!text) return;
    const chosen = $("to").value;
    let to = chosen ? [chosen] : [...new Set([...companions.keys(), ...seen])];
    if (to.length === 0) {
      showSystem(t("noCompanions"), "error");
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
    return "en"; // not the page's language: a Japanese page still reads English lines in English
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
    if (mode === "silent" || muted.has(query.params.from) || !("speechSynthesis" in window)) {
      answer(query.id, true, { spoken: false, shown: true });
      return;
    }
    const from = query.params.from;
    const utterance = new SpeechSynthesisUtterance(text);
    utterance.lang = guessLang(text);
    utterance.pitch = body.emotion === "happy" ? 1.2 : body.emotion === "sad" ? 0.85 : 1;
    utterance.rate = (body.emotion === "angry" ? 1.15 : 1) * speechRate();
    let settled = false;
    // Every wait has a deadline: an utterance that never reports its end is answered anyway.
    const deadline = setTimeout(() => finish(false, { error: "speech did not finish in time" }), 10000 + text.length * 200 / speechRate());
    function finish(ok, result) {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      markSpeaking(from, false);
      answerSpoken(query.id, ok, result);
    }
    utterance.onstart = () => markSpeaking(from, true, text);
    utterance.onend = () => finish(true, { spoken: true, engine: "speechSynthesis" });
    utterance.onerror = (event) => finish(false, { error: `speech failed: ${event.error || "unknown"}` });
    speechSynthesis.speak(utterance);
  }

  // --- approval queries -------------------------------------------------------------------
  function askApproval(query) {
    const body = query.params.body || {};
    const card = el("div", "approval");
    card.dataset.query = query.id;
    card.appendChild(el("p", "", t("asksToRun", { name: nameOf(query.params.from), action: body.action || t("anAction") })));
    if (body.description) card.appendChild(el("p", "description", body.description));
    card.appendChild(el("p", "preview", body.preview || JSON.stringify(body.input || {})));
    const decide = (approved) => {
      settleApproval(query.id);
      answeredHere.set(query.id, body.preview || body.action || query.id);
      if (answeredHere.size > 256) answeredHere.delete(answeredHere.keys().next().value);
      const verdict = approved ? "approved" : "denied";
      answer(query.id, true, { approved, reason: `${verdict} in the browser by ${me()}` });
      showSystem(t("youDecided", { verdict: t(verdict), what: body.preview || body.action || query.id }));
    };
    const yes = el("button", "approve", t("approve"));
    yes.type = "button";
    yes.addEventListener("click", () => decide(true));
    const no = el("button", "deny secondary", t("deny"));
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
      if (what !== undefined) showSystem(t("tooLate", { what }));
      return;
    }
    const text = detail.message || detail.code || "refused";
    markRefused(detail.ref, text);
    showSystem(t("bridgeSays", { text }), "error");
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
      setStatus("refused", token ? t("wrongToken") : t("tokenNeeded"));
      $("token-why").textContent = token ? t("wrongTokenWhy") : t("tokenWhy");
      $("token-form").hidden = false;
      $("token").focus();
    } else {
      setStatus("refused", t("refusedStatus", { status: refused.status }));
    }
    showSystem(t("refusedPage", { text: refused.text }), "error");
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    params.set("token", value);
    location.search = `?${params.toString()}`; // reload with the token in the address
  });

  function connect() {
    setStatus("connecting", t("connecting"));
    let opened = false;
    socket = new WebSocket(wsUrl);
    socket.addEventListener("open", () => {
      opened = true;
      socket.send(sessionFrame);
      retryMs = 500;
      setStatus("connected", t("connected"));
      loadCompanions().then(loadAppearance).then(loadHistory); // names and faces first
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
      setStatus("closed", t("retrying", { why }));
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
    if (!rtc) return t("connected");
    return rtc.voice ? `${t("connected")} · WebRTC · voice` : `${t("connected")} · WebRTC`;
  }

  function showTransport() {
    $("status").dataset.transport = rtc ? "webrtc" : "websocket";
    if (linkOpen()) setStatus("connected", transportLabel());
    if (hush) hush.hidden = !(rtc && rtc.voice);
  }

  function bridgeSpeaks(query) {
    if (!rtc || !rtc.voice || voiceMode.value !== "speak") return false;
    voicePlaying.set(query.id, query.params.from);
    markSpeaking(query.params.from, true, query.params.body?.message);
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
        setStatus("closed", t("retrying", { why: "" }));
        setTimeout(connect, retryMs);
      };
      session.channel.addEventListener("close", lost);
      session.pc.addEventListener("connectionstatechange", () => {
        if (["failed", "closed"].includes(session.pc.connectionState)) lost();
      });
    } catch (err) {
      showSystem(t("rtcUnavailable", { error: err.message }));
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

  window.companionExport = exported; // the export's text, for tests and scripts

  window.companionLink = {
    transport: () => (rtc ? "webrtc" : socket ? "websocket" : "none"),
    peerConnection: () => (rtc ? rtc.pc : null),
  };

  showSystem(START_HINT, "hint", 0); // first, whatever the history brings
  updateStop();
  connect();
  setInterval(loadCompanions, DIRECTORY_EVERY_MS);
})();
