// ferrymq dashboard: polls /stats, differences counters between polls into
// rates, keeps a short history and draws it. No dependencies, no network
// beyond the stats endpoint of the server that served the page.
'use strict';
(() => {
  const body = document.body;
  const STATS = body.dataset.stats || '/stats';
  const INTERVAL = Number(body.dataset.interval) || 1000;
  const WINDOW = Number(body.dataset.window) || 120000;
  const TOP_TOPICS = 10;
  const TOP_SLOW = 8;
  const SVGNS = 'http://www.w3.org/2000/svg';

  // ---- formatting -------------------------------------------------------

  const dash = '–';
  function fmtNum(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(2) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  }
  function fmtRate(v) {
    if (v === 0) return '0';
    if (Math.abs(v) < 10) return v.toFixed(1);
    return fmtNum(Math.round(v));
  }
  function fmtBytes(v) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(1)) + ' ' + units[i];
  }
  function fmtSeconds(s) {
    if (s === 0) return '0';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 2 : 1) + ' ms';
    return s.toFixed(2) + ' s';
  }
  function fmtAge(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
    return Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h';
  }
  const windowLabel = 'last ' + (WINDOW % 60000 === 0 ? (WINDOW / 60000) + ' min' : Math.round(WINDOW / 1000) + ' s');

  // ---- reading /stats ---------------------------------------------------

  // parseTime reads the RFC 3339 server time (nanoseconds cut to ms).
  function parseTime(s) {
    const t = Date.parse(String(s).replace(/(\.\d{3})\d+/, '$1'));
    return Number.isFinite(t) ? t : Date.now();
  }
  const metric = (doc, name) => (doc && doc.metrics ? doc.metrics[name] : undefined);
  const isHist = (v) => v !== null && typeof v === 'object' && typeof v.count === 'number' && typeof v.sum === 'number';
  // num: an unlabelled counter or gauge; undefined if absent.
  function num(doc, name) {
    const v = metric(doc, name);
    return typeof v === 'number' ? v : undefined;
  }
  // total: a counter summed over its labels (those keep, if given); 0 for
  // a labelled family with no series yet (it is absent from /stats).
  function total(doc, name, keep) {
    const v = metric(doc, name);
    if (typeof v === 'number') return v;
    let s = 0;
    if (v && typeof v === 'object' && !isHist(v)) {
      for (const [k, x] of Object.entries(v)) if (typeof x === 'number' && (!keep || keep(k))) s += x;
    }
    return s;
  }
  // rate of get() per second between a poll and an earlier one (prev);
  // null without one, a missing figure or a counter reset.
  function rate(cur, prev, get) {
    if (!prev) return null;
    const a = get(cur), b = get(prev);
    if (a === undefined || b === undefined || a === null || b === null) return null;
    const dt = (cur.t - prev.t) / 1000;
    if (!(dt > 0) || a < b) return null;
    return (a - b) / dt;
  }

  // ---- history ----------------------------------------------------------

  const hist = new Map(); // key → [{t, v}], the last WINDOW
  function push(key, t, v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return;
    let h = hist.get(key);
    if (!h) { h = []; hist.set(key, h); }
    h.push({ t, v });
  }
  function prune(now) {
    for (const [key, h] of hist) {
      while (h.length && h[0].t < now - WINDOW) h.shift();
      if (!h.length) hist.delete(key);
    }
  }
  // oldest: the earliest kept value of key (for "last 2 min" counts).
  const oldest = (key) => { const h = hist.get(key); return h && h.length ? h[0].v : undefined; };

  // ---- DOM --------------------------------------------------------------

  const all = (sel, root) => (root || document).querySelectorAll(sel);
  // set writes a figure: its text and its raw number in data-value.
  function set(name, value, fmt) {
    for (const el of all(`[data-metric="${name}"]`)) {
      if (value === null || value === undefined || !Number.isFinite(value)) {
        el.textContent = dash;
        el.dataset.value = '';
      } else {
        el.textContent = (fmt || fmtNum)(value);
        el.dataset.value = String(value);
      }
    }
  }
  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  // cell is a numeric table cell with its raw value in data-value.
  function cell(field, value, fmt) {
    const ok = value !== null && value !== undefined && Number.isFinite(value);
    return el('td', ok ? (fmt || fmtNum)(value) : dash, { class: 'n', 'data-field': field, 'data-value': ok ? String(value) : '' });
  }
  function fill(table, rows, note, emptyText) {
    const tb = document.querySelector(`[data-table="${table}"] tbody`);
    tb.replaceChildren(...rows);
    const p = document.querySelector(`[data-note="${note || table}"]`);
    if (p) p.textContent = rows.length ? '' : emptyText;
  }

  // draw renders series (keys into hist) as polylines scaled to their
  // common maximum over the window ending at now.
  function draw(svg, keys, now, fmt) {
    if (!svg) return;
    const W = 300, H = 60, PAD = 3;
    let top = 0;
    for (const k of keys) for (const p of hist.get(k) || []) top = Math.max(top, p.v);
    const scale = top > 0 ? top : 1;
    const x = (t) => ((t - (now - WINDOW)) / WINDOW * W).toFixed(1);
    const y = (v) => (H - PAD - v / scale * (H - 2 * PAD)).toFixed(1);
    const shapes = [];
    keys.forEach((k, i) => {
      const h = hist.get(k) || [];
      if (!h.length) return;
      const pts = h.map((p) => x(p.t) + ',' + y(p.v));
      if (keys.length === 1) {
        const area = document.createElementNS(SVGNS, 'path');
        area.setAttribute('d', `M${x(h[0].t)},${H} L${pts.join(' L')} L${x(h[h.length - 1].t)},${H} Z`);
        area.setAttribute('class', 'area');
        shapes.push(area);
      }
      const line = document.createElementNS(SVGNS, 'polyline');
      line.setAttribute('points', pts.join(' '));
      line.setAttribute('class', 'line s' + i);
      shapes.push(line);
    });
    svg.replaceChildren(...shapes);
    svg.dataset.points = String((hist.get(keys[0]) || []).length);
    const label = svg.parentElement && svg.parentElement.querySelector('.max');
    if (label) label.textContent = top > 0 ? 'max ' + (fmt || fmtNum)(top) : '';
  }
  const chart = (name, keys, now, fmt) => draw(document.querySelector(`svg[data-chart="${name}"]`), keys || [name], now, fmt);
  function spark(key, now) {
    const svg = document.createElementNS(SVGNS, 'svg');
    svg.setAttribute('viewBox', '0 0 300 60');
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('class', 'spark');
    draw(svg, [key], now, fmtRate);
    return svg;
  }

  // ---- the figures ------------------------------------------------------

  // Rates compare a poll with the latest earlier poll at least 0.9 of an
  // interval older on the server's clock (the previous one, normally), so
  // polls that bunch up (a throttled tab, a headless browser's virtual
  // time) do not turn into noisy rates over a few milliseconds.
  const recent = []; // the last polls, oldest first
  let prev = null; // the poll this one is compared with
  let polls = 0;
  function baseFor(doc) {
    let base = null;
    for (const d of recent) {
      if (doc.t - d.t >= 0.9 * INTERVAL) base = d;
      else break;
    }
    return base || recent[0] || null;
  }
  function remember(doc) {
    recent.push(doc);
    while (recent.length > 1 && doc.t - recent[1].t >= 0.9 * INTERVAL) recent.shift();
    if (recent.length > 1000) recent.shift();
  }

  function cards(doc, now) {
    const r = (get) => rate(doc, prev, get);
    const put = (name, v, fmt) => { set(name, v, fmt); push(name, now, v); };

    put('connections', num(doc, 'ferrymq_mqtt_connections'));
    set('sessions', num(doc, 'ferrymq_mqtt_sessions'));
    set('sessions-parked', num(doc, 'ferrymq_sessions_parked'));
    set('subscriptions', num(doc, 'ferrymq_mqtt_subscriptions'));
    put('connects-rate', r((d) => num(d, 'ferrymq_mqtt_connects_total')), fmtRate);
    set('disconnects-rate', r((d) => num(d, 'ferrymq_mqtt_disconnects_total')), fmtRate);
    set('connects-total', num(doc, 'ferrymq_mqtt_connects_total'));

    const inTotal = (d) => total(d, 'ferrymq_mqtt_publishes_received_total');
    const inQoS = (q) => (d) => total(d, 'ferrymq_mqtt_publishes_received_total', (k) => k === 'qos=' + q);
    set('mqtt-in-rate', r(inTotal), fmtRate);
    set('mqtt-in-total', inTotal(doc));
    for (const q of [0, 1, 2]) put('mqtt-in-rate-qos' + q, r(inQoS(q)), fmtRate);
    put('mqtt-out-rate', r((d) => num(d, 'ferrymq_mqtt_messages_sent_total')), fmtRate);
    set('mqtt-out-total', num(doc, 'ferrymq_mqtt_messages_sent_total'));
    set('bytes-in-rate', r((d) => num(d, 'ferrymq_mqtt_bytes_received_total')), fmtBytes);
    set('bytes-out-rate', r((d) => num(d, 'ferrymq_mqtt_bytes_sent_total')), fmtBytes);

    const appends = r((d) => num(d, 'ferrymq_store_messages_total'));
    const fsyncs = r((d) => num(d, 'ferrymq_store_fsyncs_total'));
    put('store-append-rate', appends, fmtRate);
    set('store-messages-total', num(doc, 'ferrymq_store_messages_total'));
    set('bridge-rate', r((d) => num(d, 'ferrymq_bridge_uplink_messages_total')), fmtRate);
    set('bridge-inflight', num(doc, 'ferrymq_bridge_uplink_inflight'));
    put('store-fsync-rate', fsyncs, fmtRate);
    set('store-fsyncs-total', num(doc, 'ferrymq_store_fsyncs_total'));
    set('store-per-fsync', fsyncs > 0 ? appends / fsyncs : null, fmtRate);
    set('store-write-rate', r((d) => num(d, 'ferrymq_store_write_cycles_total')), fmtRate);

    // Latency: the store's fsync histogram when exported, else the
    // bridge's append-until-durable time (which includes the fsync under
    // the sync flush policy).
    const src = isHist(metric(doc, 'ferrymq_store_fsync_seconds')) ? 'ferrymq_store_fsync_seconds' : 'ferrymq_bridge_core_append_seconds';
    const h = metric(doc, src);
    const title = document.querySelector('[data-metric="latency-title"]');
    title.textContent = src === 'ferrymq_store_fsync_seconds' ? 'Fsync latency' : 'Append → durable latency';
    title.dataset.value = src;
    title.title = src;
    const hp = metric(prev, src);
    let mean = null;
    if (isHist(h) && isHist(hp) && h.count > hp.count) mean = (h.sum - hp.sum) / (h.count - hp.count);
    put('latency-mean', mean, fmtSeconds);
    set('latency-p50', isHist(h) ? h.p50 : null, fmtSeconds);
    set('latency-p99', isHist(h) ? h.p99 : null, fmtSeconds);
    set('latency-count', isHist(h) ? h.count : null);

    put('disk-bytes', num(doc, 'ferrymq_store_disk_bytes'), fmtBytes);
    set('rss-bytes', num(doc, 'process_resident_memory_bytes'), fmtBytes);
    set('goroutines', num(doc, 'go_goroutines'));
    const waiting = metric(doc, 'ferrymq_delay_waiting');
    set('delay-waiting', waiting === undefined ? undefined : total(doc, 'ferrymq_delay_waiting'));
    set('txn-pending', num(doc, 'ferrymq_txn_pending'));

    chart('connections', null, now);
    chart('connects-rate', null, now, fmtRate);
    chart('mqtt-in', ['mqtt-in-rate-qos0', 'mqtt-in-rate-qos1', 'mqtt-in-rate-qos2'], now, fmtRate);
    chart('mqtt-out-rate', null, now, fmtRate);
    chart('store-append-rate', null, now, fmtRate);
    chart('store-fsync-rate', null, now, fmtRate);
    chart('latency-mean', null, now, fmtSeconds);
    chart('disk-bytes', null, now, fmtBytes);
  }

  // topics ranks /stats "topics" by messages per second between polls.
  function topics(doc, now) {
    if (!Array.isArray(doc.topics)) {
      fill('topics', [], null, 'Not available: this server has no local store.');
      return;
    }
    const before = new Map(((prev && prev.topics) || []).map((x) => [x.name, x.messages]));
    const dt = prev ? (doc.t - prev.t) / 1000 : 0;
    const rows = doc.topics.map((x) => {
      const b = before.get(x.name);
      const r = b !== undefined && dt > 0 && x.messages >= b ? (x.messages - b) / dt : null;
      push('topic:' + x.name, now, r);
      return { name: x.name, queues: x.queues, messages: x.messages, rate: r };
    });
    rows.sort((a, b) => (b.rate ?? -1) - (a.rate ?? -1) || b.messages - a.messages || (a.name < b.name ? -1 : 1));
    const trs = rows.slice(0, TOP_TOPICS).map((x) => {
      const tr = el('tr', null, { 'data-topic': x.name, 'data-messages': String(x.messages) });
      if (x.rate > 0) tr.className = 'live';
      const spk = el('td');
      spk.appendChild(spark('topic:' + x.name, now));
      tr.append(el('td', x.name, { class: 'name' }), cell('rate', x.rate, fmtRate), spk, cell('messages', x.messages), cell('queues', x.queues));
      return tr;
    });
    const more = (doc.topics_total || doc.topics.length) - trs.length;
    fill('topics', trs, null, 'No topics yet.');
    if (more > 0) document.querySelector('[data-note="topics"]').textContent = `${more} more topic${more === 1 ? '' : 's'} not shown.`;
  }

  const groupKey = (g) => g.group + '\u0000' + g.topic + '\u0000' + (g.member || '');
  const lastConsumed = (g) => (g.last_consumed ? parseTime(g.last_consumed) : null);

  // groups lists /stats "groups" (one row per group and topic; per member
  // for broadcast groups) and ranks the slowest.
  function groups(doc, now) {
    if (!Array.isArray(doc.groups)) {
      fill('groups', [], null, 'Not available: this server has no local store.');
      fill('slow', [], null, '');
      return;
    }
    const before = new Map(((prev && prev.groups) || []).map((g) => [groupKey(g), g.lag]));
    const dt = prev ? (doc.t - prev.t) / 1000 : 0;
    const rows = doc.groups.map((g) => {
      const b = before.get(groupKey(g));
      return Object.assign({}, g, { trend: b !== undefined && dt > 0 ? (g.lag - b) / dt : null, last: lastConsumed(g) });
    });
    const age = (g) => (g.last === null ? 'no commit yet' : fmtAge(doc.t - g.last) + ' ago');
    const who = (g) => g.member || (g.owners || []).join(', ');
    const attrs = (g) => ({ 'data-group': g.group, 'data-topic': g.topic, 'data-member': g.member || '', 'data-lag': String(g.lag) });

    const sorted = rows.slice().sort((a, b) => (a.group < b.group ? -1 : a.group > b.group ? 1 : a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : who(a) < who(b) ? -1 : 1));
    fill('groups', sorted.map((g) => {
      const tr = el('tr', null, attrs(g));
      if (g.lag > 0) tr.className = 'warn';
      tr.append(el('td', g.group, { class: 'name' }), el('td', g.topic, { class: 'name' }), el('td', g.mode || ''),
        cell('members', g.members), cell('lag', g.lag), cell('trend', g.trend, fmtRate),
        el('td', age(g), { class: 'n', 'data-field': 'last-consumed', 'data-value': g.last_consumed || '' }),
        el('td', who(g), { class: 'name', 'data-field': 'owners' }));
      return tr;
    }), null, 'No consumer groups with live members.');
    const more = (doc.groups_total || doc.groups.length) - doc.groups.length;
    if (more > 0) document.querySelector('[data-note="groups"]').textContent = `${more} more rows not sent (the ${doc.groups.length} with the most lag are shown).`;

    // Slowest first: the largest lag, then the longest since a commit.
    const slow = rows.filter((g) => g.lag > 0).sort((a, b) => b.lag - a.lag || (a.last ?? 0) - (b.last ?? 0)).slice(0, TOP_SLOW);
    fill('slow', slow.map((g) => {
      const tr = el('tr', null, attrs(g));
      tr.append(el('td', g.group, { class: 'name' }), el('td', g.topic, { class: 'name' }), el('td', who(g) || dash, { class: 'name' }),
        cell('lag', g.lag), cell('trend', g.trend, fmtRate),
        el('td', age(g), { class: 'n', 'data-field': 'last-consumed', 'data-value': g.last_consumed || '' }));
      return tr;
    }), null, 'Every consumer is caught up.');
  }

  // Errors: counters whose name says something went wrong, plus the
  // bridge's unbridged publishes and failed downlink outcomes.
  const ERROR_NAME = /_(failures|failed|refused|dropped|errors|denied|rejected|panics_recovered)_total$/;
  const NOT_ERRORS = new Set(['ferrymq_delay_dropped_total']); // cancelled copies: the cancel worked
  const EXTRA_ERRORS = {
    ferrymq_bridge_unbridged_total: () => true,
    ferrymq_downlink_messages_total: (k) => /^outcome=(expired|dropped|invalid_topic)$/.test(k),
  };
  const ERROR_TITLES = {
    ferrymq_bridge_uplink_failures_total: 'uplink refused by the core',
    ferrymq_bridge_unbridged_total: 'publishes not bridged',
    ferrymq_mqtt_connections_refused_total: 'connections refused',
    ferrymq_mqtt_messages_dropped_total: 'messages dropped for subscribers',
    ferrymq_mqtt_inflight_dropped_total: 'inflight window full',
    ferrymq_mqtt_panics_recovered_total: 'panics recovered',
    ferrymq_presence_event_failures_total: 'presence events refused',
    ferrymq_downlink_receipt_failures_total: 'receipts refused',
    ferrymq_downlink_messages_total: 'downlink not delivered',
    ferrymq_delay_failed_total: 'delayed messages undeliverable',
    ferrymq_trace_hops_dropped_total: 'trace hops dropped',
  };
  function errorSeries(doc) {
    const out = [];
    for (const [name, v] of Object.entries((doc && doc.metrics) || {})) {
      const extra = EXTRA_ERRORS[name];
      if (!extra && (!ERROR_NAME.test(name) || NOT_ERRORS.has(name))) continue;
      if (typeof v === 'number') out.push({ id: name, name, reason: '', value: v });
      else if (v && typeof v === 'object' && !isHist(v)) {
        for (const [k, x] of Object.entries(v)) {
          if (typeof x !== 'number' || (extra && !extra(k))) continue;
          out.push({ id: name + '{' + k + '}', name, reason: k.replace(/^[a-z_]+=/, ''), value: x });
        }
      }
    }
    return out;
  }
  function errors(doc, now) {
    const before = new Map(errorSeries(prev).map((e) => [e.id, e.value]));
    const dt = prev ? (doc.t - prev.t) / 1000 : 0;
    const rows = [];
    for (const e of errorSeries(doc)) {
      push('err:' + e.id, now, e.value);
      if (e.value <= 0) continue;
      const b = before.get(e.id);
      const first = oldest('err:' + e.id);
      rows.push(Object.assign(e, {
        rate: dt > 0 ? (e.value - (b ?? 0)) / dt : null,
        recent: first === undefined ? null : e.value - first,
      }));
    }
    rows.sort((a, b) => (b.recent ?? 0) - (a.recent ?? 0) || b.value - a.value || (a.id < b.id ? -1 : 1));
    fill('errors', rows.map((e) => {
      const tr = el('tr', null, { 'data-error': e.id });
      if (e.rate > 0) tr.className = 'hot';
      tr.append(el('td', ERROR_TITLES[e.name] || e.name.replace(/^ferrymq_/, '').replace(/_total$/, '').replace(/_/g, ' '), { title: e.name }),
        el('td', e.reason), cell('rate', e.rate, fmtRate), cell('recent', e.recent), cell('total', e.value));
      return tr;
    }), null, 'No errors since start.');
  }

  // alarms shows /stats "alarms": a banner while any is active, and the
  // list; and a banner while MQTT listeners take anonymous clients beyond
  // loopback (/stats "security").
  function alarms(doc) {
    const banner = document.querySelector('[data-banner="alarms"]');
    const a = doc.alarms;
    if (!a || !Array.isArray(a.active)) {
      banner.hidden = true;
      fill('alarms', [], null, 'Alarms are off on this server.');
    } else {
      const n = a.active_total || a.active.length;
      banner.dataset.count = String(n);
      banner.hidden = n === 0;
      const first = a.active[0];
      banner.textContent = n === 0 ? '' : `${n} alarm${n === 1 ? '' : 's'} active: ` +
        (first ? `${first.kind} ${first.subject} — ${first.message}` : '') + (n > 1 ? ` (and ${n - 1} more below)` : '');
      fill('alarms', a.active.map((e) => {
        const tr = el('tr', null, { 'data-alarm': e.kind, 'data-subject': e.subject });
        const since = parseTime(e.since);
        tr.append(el('td', e.kind), el('td', e.subject), cell('value', e.value), cell('threshold', e.threshold),
          el('td', since ? fmtAge(doc.t - since) + ' ago' : dash, { class: 'n', 'data-field': 'since', title: e.since }),
          el('td', e.message));
        return tr;
      }), null, 'No alarm active.');
    }
    const anon = document.querySelector('[data-banner="anonymous"]');
    const open = (doc.security && doc.security.anonymous_listeners) || [];
    anon.hidden = open.length === 0;
    anon.textContent = open.length ? `Anonymous MQTT clients may connect beyond loopback on ${open.join(', ')} (auth.anonymous: true).` : '';
  }

  function status(state, text) {
    const s = document.querySelector('[data-metric="status"]');
    s.dataset.value = state;
    s.className = 'pill ' + state;
    s.textContent = text;
    body.classList.toggle('stale', state === 'down');
  }

  function update(doc) {
    doc.t = parseTime(doc.time); // server clock: rates and ages
    const now = Date.now(); // this page's clock: the charts' time axis
    prev = baseFor(doc);
    polls++;
    set('polls', polls);
    const upd = document.querySelector('[data-metric="updated"]');
    upd.textContent = new Date(now).toLocaleTimeString();
    upd.dataset.value = doc.time;
    const start = num(doc, 'process_start_time_seconds');
    set('uptime', start ? doc.t - start * 1000 : null, fmtAge);
    status(doc.ready ? 'ready' : 'notready', doc.ready ? 'ready' : 'not ready');
    set('rate-span', prev ? (doc.t - prev.t) / 1000 : null, (v) => v.toFixed(v < 1 ? 3 : 1) + ' s');
    cards(doc, now);
    topics(doc, now);
    groups(doc, now);
    errors(doc, now);
    alarms(doc);
    prune(now);
    remember(doc);
    body.dataset.polls = String(polls);
  }

  async function poll() {
    try {
      const res = await fetch(STATS, { cache: 'no-store', credentials: 'same-origin' });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      update(await res.json());
    } catch (err) {
      status('down', 'stats unreachable');
      console.warn('dashboard: poll', err);
    } finally {
      setTimeout(poll, INTERVAL);
    }
  }

  for (const th of all('[data-window-label]')) th.textContent = windowLabel;
  set('interval', INTERVAL, (v) => (v % 1000 === 0 ? v / 1000 + ' s' : v + ' ms'));
  set('window', WINDOW, (v) => windowLabel.replace(/^last /, ''));
  poll();
})();
