// gpudiag live monitor: strip charts for N devices x M metrics, drawn on <canvas>.
//
// The kernel sends rows as binary columns (float64 times, float32 values, row-major) in
// custom messages {type: "rows"|"reset", seq, n, width}; each message holds only rows this
// browser has not had. Rows go into a fixed-size ring per widget model (shared by all its
// views); views redraw at most once per animation frame, and only when something changed.
// No build step: this file is loaded as an ES module by anywidget.

const STORES = new Map(); // model uid -> store

const PALETTE = [
  "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2",
  "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac",
];

function makeStore(capacity, width) {
  return {
    capacity,
    width,
    t: new Float64Array(capacity),
    v: new Float32Array(capacity * width),
    count: 0, // rows held so far (ring position = count % capacity)
    nextSeq: 0, // the kernel's sequence number of the next row expected
    version: 0,
    views: new Set(),
  };
}

function storeFor(model) {
  const uid = model.get("uid");
  const spec = model.get("spec") || {};
  const capacity = Math.max(16, spec.capacity || 1024);
  const width = (spec.series || []).length;
  let store = STORES.get(uid);
  if (!store || store.capacity !== capacity || store.width !== width) {
    const views = store ? store.views : new Set();
    store = makeStore(capacity, width);
    store.views = views;
    STORES.set(uid, store);
  }
  return store;
}

function asBytes(buffer) {
  // ipywidgets hands buffers over as DataView (sometimes ArrayBuffer): copy to align them.
  if (buffer instanceof ArrayBuffer) return buffer.slice(0);
  return buffer.buffer.slice(buffer.byteOffset, buffer.byteOffset + buffer.byteLength);
}

function ingest(store, msg, buffers) {
  if (!buffers || buffers.length < 2 || msg.width !== store.width) return;
  const t = new Float64Array(asBytes(buffers[0]));
  const v = new Float32Array(asBytes(buffers[1]));
  const n = Math.min(msg.n, t.length);
  if (msg.type === "reset") {
    store.count = 0;
    store.nextSeq = msg.seq;
  }
  const w = store.width;
  for (let i = 0; i < n; i++) {
    const seq = msg.seq + i;
    if (seq < store.nextSeq) continue; // already held (a backfill overlapping live rows)
    const slot = store.count % store.capacity;
    store.t[slot] = t[i];
    store.v.set(v.subarray(i * w, (i + 1) * w), slot * w);
    store.count += 1;
    store.nextSeq = seq + 1;
  }
  store.version += 1;
}

// -- formatting (mirrors gpudiag.monitoring.sampler.format_value) ----------------------------

function formatValue(value, unit) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "N/A";
  const abs = Math.abs(value);
  if (unit === "B") {
    const steps = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
    for (const [scale, name] of steps) if (abs >= scale) return `${(value / scale).toFixed(2)} ${name}`;
    return `${value.toFixed(0)} B`;
  }
  if (unit === "B/s") {
    const steps = [[1e9, "GB/s"], [1e6, "MB/s"], [1e3, "kB/s"]];
    for (const [scale, name] of steps) if (abs >= scale) return `${(value / scale).toFixed(2)} ${name}`;
    return `${value.toFixed(0)} B/s`;
  }
  if (unit === "%" || unit === "W" || unit === "°C" || unit === "GB/s") return `${value.toFixed(1)} ${unit}`;
  if (unit === "MHz") return `${value.toFixed(0)} MHz`;
  const text = Number(value.toPrecision(4)).toString();
  return unit ? `${text} ${unit}` : text;
}

// -- axes: a value scale on the left, seconds before now along the bottom ---------------------

export const AXIS_LEFT = 44; // px for the value labels
export const AXIS_BOTTOM = 11; // px for the time labels

// Compact value for an axis label: "100%", "40Gi", "1.2G/s", "300W".
export function shortValue(value, unit) {
  const abs = Math.abs(value);
  const pick = (steps, plain) => {
    for (const [scale, name] of steps) if (abs >= scale) return `${+(value / scale).toPrecision(3)}${name}`;
    return `${+value.toPrecision(3)}${plain}`;
  };
  if (unit === "B") return pick([[2 ** 40, "Ti"], [2 ** 30, "Gi"], [2 ** 20, "Mi"], [2 ** 10, "Ki"]], "B");
  if (unit === "B/s") return pick([[1e9, "G/s"], [1e6, "M/s"], [1e3, "k/s"]], "B/s");
  if (unit === "MHz") return pick([[1e3, "GHz"]], "MHz");
  return `${+value.toPrecision(3)}${unit && unit.length <= 2 ? unit : ""}`;
}

// A round top for a value scale at or above `value`, round in the unit the label shows
// (1.2Gi rather than 1.21Gi, 40°C rather than 34.1°C).
export function niceMax(value, unit) {
  if (!(value > 0)) return 1;
  let div = 1;
  const binary = [2 ** 40, 2 ** 30, 2 ** 20, 2 ** 10];
  const decimal = [1e9, 1e6, 1e3];
  const scales = unit === "B" ? binary : unit === "B/s" || unit === "MHz" ? decimal : [];
  for (const scale of scales) {
    if (value >= scale) {
      div = scale;
      break;
    }
  }
  const v = value / div;
  const power = 10 ** Math.floor(Math.log10(v));
  const step = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find((m) => m * power >= v * (1 - 1e-9));
  return +(step * power).toPrecision(6) * div;
}

// Ticks for a window of `spanS` seconds ending now: at most `maxTicks` + 1, a round step apart,
// each {offsetS (<= 0), label} with "now" for 0 ("-30s", "-2m" before it).
export function timeTicks(spanS, maxTicks = 4) {
  const steps = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
  const step = steps.find((s) => spanS / s <= maxTicks) || steps[steps.length - 1];
  const ticks = [];
  for (let k = 0; k * step <= spanS + 1e-9 && ticks.length <= maxTicks + 1; k++) {
    const back = k * step;
    const label = k === 0 ? "now" : back >= 60 ? `-${+(back / 60).toPrecision(3)}m` : `-${back}s`;
    ticks.push({ offsetS: -back, label });
  }
  return ticks;
}

function drawAxes(ctx, plot, yMax, unit, ticks, x, muted, grid) {
  ctx.font = "9px system-ui, sans-serif";
  ctx.fillStyle = muted;
  ctx.strokeStyle = grid;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const frac of [0, 0.5, 1]) {
    const yy = Math.round(plot.bottom - frac * (plot.bottom - plot.top)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(plot.left, yy);
    ctx.lineTo(plot.right, yy);
    ctx.stroke();
    if (frac !== 0.5) ctx.fillText(shortValue(frac * yMax, unit), plot.left - 3, yy);
  }
  ctx.textBaseline = "top";
  for (const tick of ticks) {
    const xx = Math.round(x(tick.offsetS)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(xx, plot.bottom);
    ctx.lineTo(xx, plot.bottom + 2);
    ctx.stroke();
    ctx.textAlign = tick.offsetS === 0 ? "right" : xx - plot.left < 12 ? "left" : "center";
    ctx.fillText(tick.label, tick.offsetS === 0 ? plot.right : xx, plot.bottom + 1);
  }
}

function clock(ts) {
  const d = new Date(ts * 1000);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- one view -----------------------------------------------------------------------------------

class MonitorView {
  constructor(model, root) {
    this.model = model;
    this.root = root;
    this.store = storeFor(model);
    this.store.views.add(this);
    this.frame = 0;
    this.drawnVersion = -1;
    this.tiles = [];
    this.throttleBadges = new Map();
    this.throttleIndex = new Map();
    this.root.classList.add("gpudiag-monitor");
    this.build();
    this.resize = new ResizeObserver(() => this.schedule(true));
    this.resize.observe(this.root);
  }

  schedule(force = false) {
    if (force) this.drawnVersion = -1;
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  build() {
    const model = this.model;
    const spec = model.get("spec") || {};
    const status = model.get("status") || {};
    const selected = new Set(model.get("selected") || []);
    const na = status.na || {};
    const notes = status.notes || {};
    this.store = storeFor(model);
    this.store.views.add(this);
    this.root.replaceChildren();
    this.tiles = [];
    this.throttleBadges = new Map();
    this.throttleIndex = new Map();
    (spec.series || []).forEach((s, i) => {
      if (s[1] === "throttled") this.throttleIndex.set(s[0], i);
    });

    const head = el("div", "gd-head");
    const title = el("span", "gd-title", spec.label || "gpudiag monitor");
    head.append(title);
    if (spec.is_recording) head.append(el("span", "gd-badge gd-recording", "recording"));
    const state = model.get("state");
    head.append(el("span", `gd-badge gd-state gd-state-${state}`, state));
    this.root.append(head);
    for (const note of spec.notes || []) this.root.append(el("div", "gd-note", note));
    if (status.error) this.root.append(el("div", "gd-error", `error: ${status.error}`));

    const grid = el("div", "gd-grid");
    for (const device of spec.devices || []) {
      const tiles = (spec.tiles || []).filter((t) => t.device === device.id && selected.has(t.metric));
      if (!tiles.length) continue;
      const row = el("div", "gd-device");
      const label = el("div", "gd-device-label");
      label.append(el("span", "gd-device-name", device.label));
      const badge = el("span", "gd-throttle");
      badge.hidden = true;
      label.append(badge);
      this.throttleBadges.set(device.id, badge);
      row.append(label);
      const tileBox = el("div", "gd-tiles");
      // Keep the order of the metric choice, not of the series.
      const order = model.get("selected") || [];
      tiles.sort((a, b) => order.indexOf(a.metric) - order.indexOf(b.metric));
      for (const tile of tiles) {
        const box = el("div", "gd-tile");
        box.dataset.tile = tile.id;
        box.title = tile.help || "";
        const top = el("div", "gd-tile-head");
        top.append(el("span", "gd-tile-label", tile.label));
        const value = el("span", "gd-tile-value", "…");
        top.append(value);
        box.append(top);
        const reasons = tile.series.map((i) => na[String(i)]).filter((r) => r);
        const allNa = reasons.length === tile.series.length;
        const canvas = el("canvas", "gd-canvas");
        const reason = el("div", "gd-na-reason");
        box.append(canvas, reason);
        const note = tile.series.map((i) => notes[String(i)]).find((n) => n);
        const noteEl = el("div", "gd-tile-note", note || "");
        noteEl.hidden = !note;
        box.append(noteEl);
        if (allNa) {
          box.classList.add("gd-na");
          value.textContent = "N/A";
          reason.textContent = reasons[0];
        } else if (reasons.length) {
          reason.textContent = `some N/A: ${reasons[0]}`;
        }
        if (reasons.length) reason.title = reasons[0]; // the full text when it is clamped
        box.dataset.points = "0";
        tileBox.append(box);
        this.tiles.push({ tile, box, canvas, value, allNa, device: device.id });
      }
      row.append(tileBox);
      grid.append(row);
    }
    this.root.append(grid);
    this.root.dataset.points = "0";
    this.root.dataset.frames = this.root.dataset.frames || "0";
    this.updateThrottle();
    this.schedule(true);
  }

  updateThrottle() {
    const throttled = (this.model.get("status") || {}).throttled || {};
    for (const [device, badge] of this.throttleBadges) {
      const info = throttled[device];
      badge.hidden = !info;
      if (info) badge.textContent = `throttled since ${clock(info.since)}: ${info.reasons.join(", ")}`;
    }
  }

  throttleSeries(device) {
    const index = this.throttleIndex.get(device);
    return index === undefined ? -1 : index;
  }

  draw() {
    const store = this.store;
    if (this.drawnVersion === store.version) return;
    this.drawnVersion = store.version;
    const held = Math.min(store.count, store.capacity);
    const windowS = this.model.get("window_s") || 60;
    const newest = held ? store.t[(store.count - 1) % store.capacity] : 0;
    const oldest = held ? store.t[(store.count - held) % store.capacity] : 0;
    const intervalS = (this.model.get("spec") || {}).interval_s || 0.1;
    // Until a window's worth has arrived the time axis spans what there is (at least a few
    // ticks), so a fresh chart is filled rather than a sliver at one edge; then it scrolls.
    const shownS = Math.min(windowS, Math.max(newest - oldest, 5 * intervalS));
    const tMin = newest - shownS;
    const dpr = window.devicePixelRatio || 1;
    const lineColor = getComputedStyle(this.root).getPropertyValue("--gd-line").trim() || "#4c78a8";
    const shade = getComputedStyle(this.root).getPropertyValue("--gd-throttle").trim() || "rgba(228, 87, 86, 0.18)";
    const muted = getComputedStyle(this.root).getPropertyValue("--gd-muted").trim() || "#666";
    const gridColor = getComputedStyle(this.root).getPropertyValue("--gd-border").trim() || "#ddd";
    const ticks = timeTicks(shownS);
    let totalPoints = 0;
    for (const item of this.tiles) {
      const { tile, canvas, value, box } = item;
      const cssWidth = Math.max(60, canvas.clientWidth);
      const cssHeight = Math.max(30, canvas.clientHeight);
      if (canvas.width !== Math.round(cssWidth * dpr) || canvas.height !== Math.round(cssHeight * dpr)) {
        canvas.width = Math.round(cssWidth * dpr);
        canvas.height = Math.round(cssHeight * dpr);
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, cssWidth, cssHeight);
      if (item.allNa || !held) {
        box.dataset.points = "0";
        continue;
      }
      // Rows inside the window, oldest first (walk back from the newest).
      let first = store.count - 1;
      while (first > store.count - held && store.t[(first - 1) % store.capacity] >= tMin) first -= 1;
      let yMax = tile.scale_max || 0;
      const last = [];
      for (const s of tile.series) {
        let lastValue = NaN;
        for (let k = first; k < store.count; k++) {
          const y = store.v[(k % store.capacity) * store.width + s];
          if (Number.isFinite(y)) {
            if (y > yMax) yMax = y;
            lastValue = y;
          }
        }
        last.push(lastValue);
      }
      if (!(yMax > 0)) yMax = 1;
      if (!tile.scale_max) yMax = niceMax(yMax * 1.05, tile.unit);
      // The plot sits right of the value scale and above the time axis.
      const plot = { left: AXIS_LEFT, right: cssWidth - 2, top: 4, bottom: cssHeight - AXIS_BOTTOM };
      const x = (ts) => plot.left + ((ts - tMin) / shownS) * (plot.right - plot.left);
      const y = (val) => plot.bottom - (val / yMax) * (plot.bottom - plot.top);
      drawAxes(ctx, plot, yMax, tile.unit, ticks, (offsetS) => x(newest + offsetS), muted, gridColor);
      box.dataset.scale = `0 to ${shortValue(yMax, tile.unit)}`;
      box.dataset.axis = ticks.map((t) => t.label).join(" ");

      // Shade the stretches where this device was throttled.
      const th = this.throttleSeries(item.device);
      if (th >= 0) {
        ctx.fillStyle = shade;
        for (let k = first; k < store.count; k++) {
          const slot = k % store.capacity;
          if (store.v[slot * store.width + th] >= 0.5) {
            const x0 = x(store.t[slot]);
            const next = k + 1 < store.count ? store.t[(k + 1) % store.capacity] : store.t[slot] + intervalS;
            ctx.fillRect(x0, plot.top, Math.max(1, x(next) - x0), plot.bottom - plot.top);
          }
        }
      }

      let points = 0;
      tile.series.forEach((s, lane) => {
        ctx.strokeStyle = tile.series.length > 1 ? PALETTE[lane % PALETTE.length] : lineColor;
        ctx.lineWidth = tile.series.length > 1 ? 1 : 1.5;
        ctx.beginPath();
        let penDown = false;
        // Min/max per pixel column: one vertical stroke per column, spikes survive.
        let column = -1;
        let lo = 0;
        let hi = 0;
        const flush = () => {
          if (column < 0) return;
          if (!penDown) {
            ctx.moveTo(column, y(lo));
            penDown = true;
          } else {
            ctx.lineTo(column, y(lo));
          }
          if (hi !== lo) ctx.lineTo(column, y(hi));
        };
        for (let k = first; k < store.count; k++) {
          const slot = k % store.capacity;
          const val = store.v[slot * store.width + s];
          if (!Number.isFinite(val)) {
            flush();
            column = -1;
            penDown = false;
            continue;
          }
          points += 1;
          const col = Math.round(x(store.t[slot]));
          if (col !== column) {
            flush();
            column = col;
            lo = val;
            hi = val;
          } else {
            lo = Math.min(lo, val);
            hi = Math.max(hi, val);
          }
        }
        flush();
        ctx.stroke();
      });
      totalPoints += points;
      box.dataset.points = String(points);
      const finite = last.filter((v) => Number.isFinite(v));
      if (!finite.length) {
        value.textContent = "N/A";
      } else if (finite.length === 1) {
        value.textContent = formatValue(finite[0], tile.unit);
      } else {
        const mean = finite.reduce((a, b) => a + b, 0) / finite.length;
        value.textContent = `avg ${formatValue(mean, tile.unit)} · max ${formatValue(Math.max(...finite), tile.unit)}`;
      }
    }
    this.root.dataset.points = String(totalPoints);
    this.root.dataset.rows = String(store.count);
    this.root.dataset.frames = String(Number(this.root.dataset.frames || "0") + 1);
  }

  destroy() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.resize.disconnect();
    this.store.views.delete(this);
  }
}

export default {
  initialize({ model }) {
    const onMessage = (msg, buffers) => {
      if (!msg || (msg.type !== "rows" && msg.type !== "reset")) return;
      const store = storeFor(model);
      ingest(store, msg, buffers);
      for (const view of store.views) view.schedule();
    };
    model.on("msg:custom", onMessage);
    // Ask for the rows sent before this browser existed (a reload, a second tab).
    model.send({ type: "hello" });
    return () => {
      model.off("msg:custom", onMessage);
      STORES.delete(model.get("uid"));
    };
  },

  render({ model, el: root }) {
    const view = new MonitorView(model, root);
    const rebuild = () => view.build();
    const redraw = () => view.schedule(true);
    const status = () => view.build();
    model.on("change:spec", rebuild);
    model.on("change:selected", rebuild);
    model.on("change:state", rebuild);
    model.on("change:status", status);
    model.on("change:window_s", redraw);
    return () => {
      model.off("change:spec", rebuild);
      model.off("change:selected", rebuild);
      model.off("change:state", rebuild);
      model.off("change:status", status);
      model.off("change:window_s", redraw);
      view.destroy();
    };
  },
};
