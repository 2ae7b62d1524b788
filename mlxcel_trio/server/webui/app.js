// mlxcel-trio's chat page.  Plain JavaScript, no build step, no external fetch.
//
// How an answer survives a reload or a dropped connection: every answer is
// requested with its own X-Conversation-Id (the message's `sid`), so the
// server keeps the stream's exact bytes.  The page counts the bytes of the
// complete SSE frames it has applied (`offset`) and stores that count
// together with the text those frames produced, in one localStorage write.
// After a reload or a network error it asks for the rest with
// GET v1/stream?conv_id=<sid>&from=<offset>; the server answers exactly the
// bytes that follow, so the text ends equal to an uninterrupted answer's.
// Stop aborts the request and cancels the generation with DELETE v1/stream.
//
// Model text is rendered through markdown.js, which builds DOM nodes and
// never parses HTML; user text is set as textContent.  The API key, the
// settings and the conversations live in this browser's localStorage only.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const STORE = {
    key: 'mlxcel.apiKey', convs: 'mlxcel.conversations',
    settings: 'mlxcel.settings', current: 'mlxcel.current', model: 'mlxcel.model',
  };
  // Router mode (/props role "router"): the models it serves, in a picker;
  // the one picked goes as each request's "model", which routes it.  What
  // each takes comes from /v1/models (architecture.input_modalities, read
  // from its config), so picking one sets the Attach button without loading it.
  let routerModel = '';
  let routerInputs = {};            // model id -> its input_modalities
  // An empty sampling setting is the server's own default: it is not sent, so
  // the server's --temp, --top-k ... apply until the user sets a value (the
  // settings dialog shows the server's values from /props as placeholders).
  const DEFAULTS = {
    temperature: '', top_p: '', top_k: '', min_p: '', max_tokens: '',
    systemMessage: '', customJson: '',
  };
  const NUMERIC = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens'];
  const RETRY_MS = [250, 500, 1000, 2000, 4000];
  const EXPORT_FORMAT = 'mlxcel-trio-conversations';

  let convs = loadJson(STORE.convs, []);
  if (!Array.isArray(convs)) convs = [];
  let currentId = localStorage.getItem(STORE.current);
  let serverDefaults = {};
  let serverParams = {};            // /props default_generation_settings.params
  let ready = false;
  let editing = null;               // {convId, msgId} while the composer edits a message
  // What /props says the model takes besides text; the composer offers an
  // attachment only for these, and each goes as an OpenAI content part.
  let modalities = { vision: false, audio: false };
  let pending = [];                 // content parts the next message carries
  const live = new Map();           // assistant msg id -> AbortController of its stream
  let renderQueued = false;

  // ---- storage ---------------------------------------------------------------

  function loadJson(key, fallback) {
    try {
      const text = localStorage.getItem(key);
      return text === null ? fallback : JSON.parse(text);
    } catch (e) {
      return fallback;
    }
  }

  function save() {
    try {
      localStorage.setItem(STORE.convs, JSON.stringify(convs));
      if (currentId) localStorage.setItem(STORE.current, currentId);
      else localStorage.removeItem(STORE.current);
    } catch (e) {
      // the page goes on; only a reload would lose what was not stored
      setStatus('browser storage is full: delete or export some conversations');
    }
  }

  function uid() {
    const b = new Uint8Array(12);
    crypto.getRandomValues(b);
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  function currentConv() {
    return convs.find((c) => c.id === currentId) || null;
  }

  function settings() {
    const server = {};
    if (serverDefaults && typeof serverDefaults === 'object' && !Array.isArray(serverDefaults)) {
      for (const k of Object.keys(DEFAULTS)) if (k in serverDefaults) server[k] = serverDefaults[k];
    }
    return { ...DEFAULTS, ...server, ...loadJson(STORE.settings, {}) };
  }

  // ---- HTTP --------------------------------------------------------------------

  function api(path, init = {}) {
    const headers = { ...(init.headers || {}) };
    const key = localStorage.getItem(STORE.key);
    if (key) headers.Authorization = 'Bearer ' + key;
    return fetch(new URL(path, document.baseURI), { ...init, headers });
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return 'HTTP ' + resp.status;
  }

  function setStatus(text) {
    $('status').textContent = text;
  }

  async function loadPicker() {
    const resp = await api('v1/models');
    if (!resp.ok) {
      setStatus('cannot list the models: ' + await errorText(resp));
      return false;
    }
    const models = (await resp.json()).data || [];
    const ids = models.map((m) => String(m.id));
    routerInputs = {};
    for (const m of models) {
      const inputs = (m.architecture || {}).input_modalities;
      routerInputs[String(m.id)] = Array.isArray(inputs) ? inputs : [];
    }
    const pick = $('model-pick');
    pick.replaceChildren(...ids.map((id) => {
      const opt = document.createElement('option');
      opt.value = id;
      opt.textContent = id;
      return opt;
    }));
    const saved = localStorage.getItem(STORE.model);
    routerModel = ids.includes(saved) ? saved : (ids[0] || '');
    pick.value = routerModel;
    pick.hidden = false;
    $('model-name').hidden = true;
    pickedInputs();
    return true;
  }

  // The picked model's modalities, as /props reports a single model's.
  function pickedInputs() {
    const inputs = routerInputs[routerModel] || [];
    modalities = { vision: inputs.includes('image'), audio: inputs.includes('audio') };
    showAttach();
  }

  $('model-pick').addEventListener('change', (e) => {
    routerModel = e.target.value;
    localStorage.setItem(STORE.model, routerModel);
    pickedInputs();
  });

  async function connect() {
    let resp;
    try {
      resp = await api('props');
    } catch (e) {
      setStatus('server unreachable; retrying');
      setTimeout(connect, 2000);
      return;
    }
    if (resp.status === 401) {
      showKeyPrompt(localStorage.getItem(STORE.key) ? 'The server refused this key.' : '');
      return;
    }
    if (resp.status === 503) {
      setStatus('loading model…');
      setTimeout(connect, 1000);
      return;
    }
    if (!resp.ok) {
      setStatus('cannot read /props: ' + await errorText(resp));
      return;
    }
    const props = await resp.json();
    $('key-prompt').hidden = true;
    const name = String(props.model_alias || props.model_path || 'model');
    // a local directory is shown by its last component, a repo id as it is
    const shown = name.startsWith('/') ? name.split('/').filter(Boolean).pop() : name;
    $('model-name').textContent = shown;
    $('model-name').title = name;
    const gen = props.default_generation_settings || {};
    $('model-ctx').textContent = gen.n_ctx ? 'context ' + gen.n_ctx : '';
    serverDefaults = props.ui_settings;
    const mod = props.modalities || {};
    modalities = { vision: mod.vision === true, audio: mod.audio === true };
    showAttach();
    serverParams = gen.params || {};
    if (props.role === 'router' && !(await loadPicker())) return;
    ready = true;
    setStatus('');
    resumeAll();
    render();
  }

  function showKeyPrompt(error) {
    ready = false;
    $('key-prompt').hidden = false;
    $('key-error').textContent = error;
    $('key-error').hidden = !error;
    $('key-input').focus();
    render();
  }

  // ---- streaming ---------------------------------------------------------------

  function requestBody(conv, upto) {
    const s = settings();
    const messages = [];
    if (s.systemMessage) messages.push({ role: 'system', content: String(s.systemMessage) });
    for (const m of conv.messages.slice(0, upto)) {
      if (m.role === 'user' && Array.isArray(m.parts) && m.parts.length) {
        const parts = m.parts.map((a) => a.part);
        if (m.content) parts.push({ type: 'text', text: m.content });
        messages.push({ role: 'user', content: parts });
      } else if (m.role === 'user' || (m.role === 'assistant' && m.content)) {
        messages.push({ role: m.role, content: m.content });
      }
    }
    const body = { messages, stream: true };
    if (routerModel) body.model = routerModel;
    for (const k of NUMERIC) {
      const v = Number(s[k]);
      if (s[k] === '' || s[k] === null || !Number.isFinite(v)) continue;
      if (k === 'max_tokens' && v < 0) continue;
      body[k] = v;
    }
    const custom = String(s.customJson || '').trim();
    if (custom) Object.assign(body, JSON.parse(custom));
    return body;
  }

  async function start(conv, msg) {
    let body;
    try {
      body = requestBody(conv, conv.messages.indexOf(msg));
    } catch (e) {
      finish(msg, 'error', 'Custom JSON is not valid JSON: ' + e.message);
      return;
    }
    const ctrl = new AbortController();
    ctrl.opening = true;              // until the answer's headers (see stop)
    live.set(msg.id, ctrl);
    render();
    let resp = null;
    try {
      resp = await api('v1/chat/completions', {
        method: 'POST', signal: ctrl.signal, body: JSON.stringify(body),
        headers: { 'Content-Type': 'application/json', 'X-Conversation-Id': msg.sid },
      });
    } catch (e) {
      if (ctrl.signal.aborted) return;
    }
    ctrl.opening = false;
    if (ctrl.onOpen) {
      ctrl.onOpen();
      return;
    }
    if (resp && !resp.ok) {
      if (resp.status === 401) showKeyPrompt('The server refused this key.');
      finish(msg, 'error', await errorText(resp));
      return;
    }
    await follow(msg, ctrl, resp);
  }

  function resumeAll() {
    for (const conv of convs) {
      for (const msg of conv.messages) {
        if (msg.role === 'assistant' && msg.state === 'streaming' && !live.has(msg.id)) {
          const ctrl = new AbortController();
          live.set(msg.id, ctrl);
          follow(msg, ctrl, null);
        }
      }
    }
  }

  // Reads the answer to its end, resuming from msg.offset after any failure.
  async function follow(msg, ctrl, resp) {
    let failures = 0;
    for (;;) {
      if (ctrl.signal.aborted) return;
      try {
        if (!resp) {
          setStatus('resuming…');
          const q = 'conv_id=' + encodeURIComponent(msg.sid) + '&from=' + msg.offset;
          resp = await api('v1/stream?' + q, { signal: ctrl.signal });
          if (!resp.ok) {
            const why = resp.status === 404
              ? 'the server no longer has this answer (it expired or the server restarted)'
              : await errorText(resp);
            finish(msg, 'error', 'could not resume: ' + why);
            return;
          }
        }
        setStatus('');
        const before = msg.offset;
        if (await consume(resp, msg)) {
          finish(msg, msg.error ? 'error' : 'done');
          return;
        }
        if (msg.offset > before) failures = 0;
        throw new Error('the stream ended before the answer did');
      } catch (e) {
        if (ctrl.signal.aborted) return;
        resp = null;
        if (failures >= RETRY_MS.length) {
          finish(msg, 'error', 'connection lost: ' + e.message);
          return;
        }
        setStatus('connection lost; reconnecting…');
        await new Promise((ok) => setTimeout(ok, RETRY_MS[failures]));
        failures += 1;
      }
    }
  }

  // Applies the response's complete frames to msg; true once the answer ended.
  async function consume(resp, msg) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      let used = 0;
      let ended = false;
      for (let i = 0; i + 1 < buf.length && !ended; i++) {
        if (buf[i] === 10 && buf[i + 1] === 10) {
          ended = applyFrame(msg, decoder.decode(buf.subarray(used, i)));
          used = i + 2;
          i += 1;
        }
      }
      if (used) {
        msg.offset += used;
        buf = buf.slice(used);
        save();                       // text and offset together, or neither
        queueRender();
      }
      if (ended) {
        reader.cancel().catch(() => {});
        return true;
      }
    }
  }

  function applyFrame(msg, frame) {
    for (const line of frame.split('\n')) {
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return true;
      let obj;
      try {
        obj = JSON.parse(data);
      } catch (e) {
        continue;
      }
      if (obj.error) {
        msg.error = obj.error.message || JSON.stringify(obj.error);
        return true;
      }
      const choice = (obj.choices || [])[0];
      if (choice && choice.delta) {
        if (typeof choice.delta.content === 'string') msg.content += choice.delta.content;
        if (typeof choice.delta.reasoning_content === 'string') {
          msg.reasoning = (msg.reasoning || '') + choice.delta.reasoning_content;
        }
      }
      if (choice && choice.finish_reason) msg.finish = choice.finish_reason;
      if (obj.timings) {
        msg.timings = { n: obj.timings.predicted_n, tps: obj.timings.predicted_per_second };
      }
    }
    return false;
  }

  function finish(msg, state, error) {
    const ctrl = live.get(msg.id);
    if (ctrl) ctrl.abort();
    live.delete(msg.id);
    msg.state = state;
    if (error) msg.error = error;
    save();
    setStatus('');
    render();
  }

  // The server has the session once the answer's headers came back; a DELETE
  // sent before that could arrive first and leave the generation running, so a
  // Stop pressed earlier waits for the headers, then cancels.
  function stop(msg) {
    const ctrl = live.get(msg.id);
    live.delete(msg.id);
    msg.state = 'stopped';
    save();
    setStatus('');
    render();
    const cancel = () => {
      api('v1/stream?conv_id=' + encodeURIComponent(msg.sid), { method: 'DELETE' })
        .catch(() => {});
      if (ctrl) ctrl.abort();
    };
    if (ctrl && ctrl.opening) ctrl.onOpen = cancel;
    else cancel();
  }

  // ---- actions -----------------------------------------------------------------

  function newConv() {
    const conv = { id: uid(), title: 'New chat', created: Date.now(), messages: [] };
    convs.unshift(conv);
    currentId = conv.id;
    save();
    return conv;
  }

  function ask(conv, text, parts) {
    const msg = { id: uid(), role: 'user', content: text };
    if (parts.length) msg.parts = parts;
    conv.messages.push(msg);
    if (conv.title === 'New chat') conv.title = (text || parts[0].name).slice(0, 48);
    answer(conv);
  }

  function answer(conv) {
    const msg = {
      id: uid(), role: 'assistant', content: '', reasoning: '', state: 'streaming',
      sid: uid(), offset: 0,
    };
    conv.messages.push(msg);
    save();
    render();
    start(conv, msg);
  }

  function busy(conv) {
    return !!conv && conv.messages.some((m) => m.state === 'streaming');
  }

  function submit() {
    const text = $('input').value.trim();
    if (!ready || (!text && !pending.length)) return;
    let conv = currentConv();
    if (busy(conv)) return;
    if (editing) {
      conv = convs.find((c) => c.id === editing.convId);
      const idx = conv ? conv.messages.findIndex((m) => m.id === editing.msgId) : -1;
      editing = null;
      $('editing').hidden = true;
      if (idx < 0) return;
      conv.messages = conv.messages.slice(0, idx);
      currentId = conv.id;
    }
    if (!conv) conv = newConv();
    $('input').value = '';
    const parts = pending;
    pending = [];
    renderPending();
    ask(conv, text, parts);
  }

  function regenerate(conv, msg) {
    if (busy(conv)) return;
    conv.messages = conv.messages.slice(0, conv.messages.indexOf(msg));
    answer(conv);
  }

  function edit(conv, msg) {
    if (busy(conv)) return;
    editing = { convId: conv.id, msgId: msg.id };
    $('editing').hidden = false;
    $('input').value = msg.content;
    pending = Array.isArray(msg.parts) ? msg.parts.slice() : [];
    renderPending();
    $('input').focus();
  }

  // ---- attachments ---------------------------------------------------------------

  const AUDIO_FORMATS = { 'audio/wav': 'wav', 'audio/x-wav': 'wav', 'audio/wave': 'wav',
    'audio/mpeg': 'mp3', 'audio/mp3': 'mp3' };

  function showAttach() {
    const accept = [];
    if (modalities.vision) accept.push('image/*');
    if (modalities.audio) accept.push('audio/wav', 'audio/mpeg', '.wav', '.mp3');
    $('attach').accept = accept.join(',');
    $('attach-label').hidden = !accept.length;
    // attachments the model now in use cannot take (another one was picked)
    const kept = pending.filter((a) => (a.part.type === 'image_url' ? modalities.vision
      : modalities.audio));
    if (kept.length !== pending.length) {
      pending = kept;
      renderPending();
    }
  }

  function readDataUrl(file) {
    return new Promise((ok, fail) => {
      const reader = new FileReader();
      reader.onload = () => ok(String(reader.result));
      reader.onerror = () => fail(reader.error);
      reader.readAsDataURL(file);
    });
  }

  function audioFormat(file) {
    if (AUDIO_FORMATS[file.type]) return AUDIO_FORMATS[file.type];
    const ext = file.name.toLowerCase().split('.').pop();
    return ext === 'wav' || ext === 'mp3' ? ext : '';
  }

  // An image goes as an image_url data URL, audio as input_audio (base64
  // and its format, wav or mp3: what the chat route reads).
  async function attach(files) {
    for (const file of files) {
      const isImage = file.type.startsWith('image/');
      const format = isImage ? '' : audioFormat(file);
      if (!(isImage && modalities.vision) && !(format && modalities.audio)) {
        setStatus('cannot attach ' + file.name + ': the model takes ' +
          [modalities.vision && 'images', modalities.audio && 'WAV or MP3 audio']
            .filter(Boolean).join(' and ') + ' only');
        continue;
      }
      let url;
      try {
        url = await readDataUrl(file);
      } catch (e) {
        setStatus('cannot read ' + file.name);
        continue;
      }
      const part = isImage
        ? { type: 'image_url', image_url: { url } }
        : { type: 'input_audio', input_audio: { data: url.slice(url.indexOf(',') + 1), format } };
      pending.push({ name: file.name, part });
    }
    renderPending();
  }

  function attachmentView(a) {
    if (a.part.type === 'image_url') {
      const img = document.createElement('img');
      img.src = a.part.image_url.url;
      img.alt = a.name;
      img.title = a.name;
      return img;
    }
    const span = document.createElement('span');
    span.textContent = 'audio: ' + a.name;
    return span;
  }

  function renderPending() {
    const list = $('pending');
    list.replaceChildren(...pending.map((a, i) => {
      const li = document.createElement('li');
      li.append(attachmentView(a), button('Remove', () => {
        pending.splice(i, 1);
        renderPending();
      }, 'small remove'));
      return li;
    }));
    list.hidden = !pending.length;
  }

  async function copy(text) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {
      const area = document.createElement('textarea');
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand('copy');
      area.remove();
    }
  }

  function exportAll() {
    const doc = { format: EXPORT_FORMAT, version: 1, conversations: convs };
    const blob = new Blob([JSON.stringify(doc, null, 2)], { type: 'application/json' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = 'conversations.json';
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  function cleanMessage(m) {
    const role = m && (m.role === 'user' || m.role === 'assistant') ? m.role : null;
    if (!role || typeof m.content !== 'string') return null;
    const out = { id: uid(), role, content: m.content };
    if (role === 'user' && Array.isArray(m.parts)) {
      const parts = m.parts.filter(validAttachment);
      if (parts.length) out.parts = parts;
    }
    if (role === 'assistant') {
      out.reasoning = typeof m.reasoning === 'string' ? m.reasoning : '';
      out.state = m.state === 'error' ? 'error' : (m.state === 'done' ? 'done' : 'stopped');
      out.sid = uid();
      out.offset = 0;
      if (typeof m.error === 'string') out.error = m.error;
    }
    return out;
  }

  function validAttachment(a) {
    if (!a || typeof a.name !== 'string' || !a.part) return false;
    const p = a.part;
    if (p.type === 'image_url') {
      return !!p.image_url && typeof p.image_url.url === 'string' &&
        p.image_url.url.startsWith('data:image/');
    }
    return p.type === 'input_audio' && !!p.input_audio &&
      typeof p.input_audio.data === 'string' && ['wav', 'mp3'].includes(p.input_audio.format);
  }

  async function importFile(file) {
    let doc;
    try {
      doc = JSON.parse(await file.text());
    } catch (e) {
      setStatus('import failed: not JSON');
      return;
    }
    const list = Array.isArray(doc) ? doc : (doc && doc.conversations);
    if (!Array.isArray(list)) {
      setStatus('import failed: no conversations in this file');
      return;
    }
    const imported = [];
    for (const c of list) {
      if (!c || !Array.isArray(c.messages)) continue;
      const messages = c.messages.map(cleanMessage).filter(Boolean);
      imported.push({
        id: uid(), title: typeof c.title === 'string' ? c.title : 'Imported chat',
        created: Date.now(), messages,
      });
    }
    const n = imported.length;
    convs = [...imported, ...convs];      // in the file's order, before the others
    if (n) currentId = convs[0].id;
    save();
    setStatus('imported ' + n + ' conversation(s)');
    render();
  }

  // ---- rendering -----------------------------------------------------------------

  function button(label, onClick, cls) {
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = label;
    if (cls) b.className = cls;
    b.addEventListener('click', onClick);
    return b;
  }

  function queueRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      render();
    });
  }

  function renderList() {
    const list = $('conv-list');
    list.replaceChildren();
    for (const conv of convs) {
      const li = document.createElement('li');
      if (conv.id === currentId) li.className = 'current';
      li.append(button(conv.title || 'Untitled', () => {
        currentId = conv.id;
        save();
        render();
      }, 'title'));
      li.append(button('Rename', () => {
        const title = window.prompt('Rename conversation', conv.title);
        if (title !== null && title.trim()) {
          conv.title = title.trim();
          save();
          render();
        }
      }, 'small rename'));
      li.append(button('Delete', () => {
        if (!window.confirm('Delete "' + conv.title + '"?')) return;
        for (const m of conv.messages) if (m.state === 'streaming') stop(m);
        convs = convs.filter((c) => c !== conv);
        if (currentId === conv.id) currentId = convs.length ? convs[0].id : null;
        save();
        render();
      }, 'small delete'));
      list.append(li);
    }
  }

  function renderMessage(conv, msg) {
    const art = document.createElement('article');
    art.className = 'msg ' + msg.role;
    art.dataset.id = msg.id;
    if (msg.state) art.dataset.state = msg.state;
    const role = document.createElement('div');
    role.className = 'role';
    role.textContent = msg.role === 'user' ? 'You' : 'Assistant';
    art.append(role);
    if (msg.reasoning) {
      const det = document.createElement('details');
      det.className = 'reasoning';
      det.open = msg.state === 'streaming' && !msg.content;
      const sum = document.createElement('summary');
      sum.textContent = 'Reasoning';
      const body = document.createElement('div');
      body.textContent = msg.reasoning;
      det.append(sum, body);
      art.append(det);
    }
    const content = document.createElement('div');
    content.className = 'content';
    if (msg.role === 'user') content.textContent = msg.content;
    else content.append(window.MlxMarkdown.render(msg.content));
    if (msg.role === 'user' && Array.isArray(msg.parts) && msg.parts.length) {
      const box = document.createElement('div');
      box.className = 'attachments';
      box.append(...msg.parts.map(attachmentView));
      art.append(box);
    }
    art.append(content);
    if (msg.role === 'assistant') {
      const meta = document.createElement('div');
      meta.className = 'meta';
      const parts = [];
      if (msg.timings && msg.timings.n) {
        parts.push(msg.timings.n + ' tokens');
        if (msg.timings.tps) parts.push(msg.timings.tps.toFixed(1) + ' tokens/s');
      }
      if (msg.state === 'streaming') parts.push('generating…');
      if (msg.state === 'stopped') parts.push('stopped');
      meta.textContent = parts.join(' · ');
      art.append(meta);
      if (msg.error) {
        const err = document.createElement('div');
        err.className = 'error';
        err.textContent = msg.error;
        art.append(err);
      }
    }
    if (msg.state !== 'streaming') {
      const actions = document.createElement('div');
      actions.className = 'actions';
      actions.append(button('Copy', () => copy(msg.content), 'copy'));
      if (msg.role === 'user') actions.append(button('Edit', () => edit(conv, msg), 'edit'));
      else actions.append(button('Regenerate', () => regenerate(conv, msg), 'regenerate'));
      art.append(actions);
    }
    return art;
  }

  function render() {
    renderList();
    const conv = currentConv();
    const box = $('messages');
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    box.replaceChildren(...(conv ? conv.messages.map((m) => renderMessage(conv, m)) : []));
    if (atBottom) box.scrollTop = box.scrollHeight;
    const streaming = busy(conv);
    $('send').disabled = !ready || streaming;
    $('stop').hidden = !streaming;
  }

  // ---- settings dialog ----------------------------------------------------------

  function openSettings() {
    const s = settings();
    for (const k of Object.keys(DEFAULTS)) $('set-' + k).value = s[k] === undefined ? '' : s[k];
    for (const k of NUMERIC) {
      const v = k === 'max_tokens' ? serverParams.n_predict : serverParams[k];
      // /props reports float32 values (0.10000000149011612): shown to 6 digits
      const shown = typeof v === 'number' ? Number(v.toPrecision(6)) : v;
      $('set-' + k).placeholder = v === undefined ? 'server default' : 'server: ' + shown;
    }
    $('settings-error').hidden = true;
    $('settings').hidden = false;
  }

  function saveSettings() {
    const out = {};
    for (const k of Object.keys(DEFAULTS)) {
      const v = $('set-' + k).value;
      out[k] = NUMERIC.includes(k) ? (v === '' ? '' : Number(v)) : v;
    }
    if (out.customJson.trim()) {
      try {
        const parsed = JSON.parse(out.customJson);
        if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
          throw new Error('not an object');
        }
      } catch (e) {
        $('settings-error').textContent = 'Custom JSON must be a JSON object: ' + e.message;
        $('settings-error').hidden = false;
        return;
      }
    }
    localStorage.setItem(STORE.settings, JSON.stringify(out));
    $('settings').hidden = true;
  }

  // ---- wiring ------------------------------------------------------------------

  function wire() {
    $('composer').addEventListener('submit', (e) => {
      e.preventDefault();
      submit();
    });
    $('input').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        submit();
      }
    });
    $('stop').addEventListener('click', () => {
      const conv = currentConv();
      if (conv) for (const m of conv.messages) if (m.state === 'streaming') stop(m);
    });
    $('new-chat').addEventListener('click', () => {
      newConv();
      render();
    });
    $('edit-cancel').addEventListener('click', () => {
      editing = null;
      $('editing').hidden = true;
      $('input').value = '';
      pending = [];
      renderPending();
    });
    $('export').addEventListener('click', exportAll);
    $('attach').addEventListener('change', (e) => {
      const files = Array.from(e.target.files || []);
      e.target.value = '';
      attach(files);
    });
    $('import-file').addEventListener('change', (e) => {
      const file = e.target.files && e.target.files[0];
      if (file) importFile(file);
      e.target.value = '';
    });
    $('key-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const key = $('key-input').value.trim();
      if (!key) return;
      localStorage.setItem(STORE.key, key);
      $('key-input').value = '';
      connect();
    });
    $('settings-open').addEventListener('click', openSettings);
    $('settings-close').addEventListener('click', () => { $('settings').hidden = true; });
    $('settings-reset').addEventListener('click', () => {
      localStorage.removeItem(STORE.settings);
      openSettings();
    });
    $('settings-form').addEventListener('submit', (e) => {
      e.preventDefault();
      saveSettings();
    });
  }

  // The worker (sw.js) caches nothing and intercepts nothing: registering it
  // makes the page installable and retires any worker an earlier UI on this
  // origin left.  Browsers allow it on https and localhost only.
  function registerWorker() {
    if (!('serviceWorker' in navigator) || !window.isSecureContext) return;
    navigator.serviceWorker.register('sw.js').catch(() => {});
  }

  wire();
  render();
  connect();
  registerWorker();
})();
