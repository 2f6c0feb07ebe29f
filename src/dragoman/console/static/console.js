// dragoman console: each view reads its one JSON endpoint (live views at most every 5 s),
// renders tables with textContent only (never HTML from data) and charts with uPlot.
(() => {
  "use strict";
  const POLL_MS = 5000;
  const $ = (id) => document.getElementById(id);
  const PALETTE = ["#0b57d0", "#b3261e", "#0a7a3b", "#8a4b00", "#6a1b9a", "#00707a", "#c2185b", "#4e5b00", "#37474f", "#5d4037"];

  function csrf() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }

  function say(text, bad) {
    const node = $("status");
    if (!node) return;
    node.textContent = text || "";
    node.classList.toggle("bad", !!bad);
  }

  async function answer(response) {
    if (response.status === 401) {
      location.assign("/console/signin");
      throw new Error("signed out");
    }
    const type = response.headers.get("content-type") || "";
    const body = type.includes("json") ? await response.json() : await response.text();
    if (!response.ok) throw new Error(body && body.error ? body.error.message : "HTTP " + response.status);
    return body;
  }

  async function getJSON(url) {
    return answer(await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } }));
  }

  async function postJSON(url, body) {
    return answer(await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-csrf-token": csrf() },
      body: JSON.stringify(body || {}),
    }));
  }

  // One request at a time per view, at most every POLL_MS; none while the tab is hidden.
  function live(load, poll) {
    let busy = false;
    let timer = null;
    const tick = async () => {
      if (busy) return;
      busy = true;
      try {
        await load();
        say("Updated " + new Date().toLocaleTimeString());
      } catch (error) {
        say(error.message, true);
      } finally {
        busy = false;
      }
    };
    const restart = () => {
      if (timer) clearInterval(timer);
      tick();
      if (poll) timer = setInterval(() => { if (!document.hidden) tick(); }, POLL_MS);
    };
    restart();
    return restart;
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function num(value) {
    if (value === null || value === undefined || value === "") return "–";
    return typeof value === "number" ? value.toLocaleString("en-US", { maximumFractionDigits: 3 }) : String(value);
  }

  function pct(value) {
    return value === null || value === undefined ? "–" : (value * 100).toFixed(1) + "%";
  }

  function secs(value) {
    return value === null || value === undefined ? "–" : num(value) + " s";
  }

  function seconds(t) {
    return typeof t === "number" ? t : Date.parse(t) / 1000;
  }

  function when(t) {
    if (t === null || t === undefined) return "–";
    return new Date(seconds(t) * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function fillRows(tbody, rows, cells) {
    tbody.replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      for (const [value, cls] of cells(row)) tr.append(value instanceof Node ? wrap(value) : el("td", value, cls));
      return tr;
    }));
  }

  function wrap(node) {
    const td = document.createElement("td");
    td.append(node);
    return td;
  }

  function pairs(dl, entries) {
    dl.className = "pairs";
    dl.replaceChildren(...entries.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
  }

  // ---- charts (uPlot) ----
  const charts = new Map();

  function chart(id, labels, xs, ys, opts) {
    const host = $(id);
    const options = opts || {};
    const data = [xs, ...ys];
    const shape = labels.join("\u0000") + (options.stacked ? "|s" : "");
    const held = charts.get(id);
    if (held && held.shape === shape) {
      held.raw = options.raw;
      held.plot.setData(data);
      return;
    }
    if (held) held.plot.destroy();
    const entry = { shape, raw: options.raw, plot: null };
    const series = [{}, ...labels.map((label, i) => ({
      label,
      stroke: PALETTE[i % PALETTE.length],
      width: 2,
      fill: options.stacked ? PALETTE[i % PALETTE.length] + "55" : undefined,
      points: options.sparse ? { show: true, size: 6 } : {},  // a lone bucket between empty ones still shows
      value: (u, v, si, idx) => {
        const raw = entry.raw ? entry.raw[si - 1][idx] : v;
        return options.percent ? pct(raw) : raw === null || raw === undefined ? "–" : num(raw);
      },
    }))];
    const bands = options.stacked ? labels.slice(1).map((_, i) => ({ series: [i + 2, i + 1] })) : undefined;
    entry.plot = new uPlot({
      width: Math.max(host.clientWidth, 300), height: 220, series, bands,
      axes: [{}, { size: 70, values: options.percent ? (u, ticks) => ticks.map((v) => Math.round(v * 100) + "%") : undefined }],
      scales: { x: { time: true }, y: options.percent ? { range: [0, 1] } : {} }, cursor: { drag: { x: false, y: false } },
    }, data, host);
    charts.set(id, entry);
  }

  window.addEventListener("resize", () => {
    for (const [id, entry] of charts) entry.plot.setSize({ width: Math.max($(id).clientWidth, 300), height: 220 });
  });

  // ---- views ----
  function overview() {
    const period = $("period");
    const restart = live(async () => {
      const data = await getJSON("/console/data/overview?period=" + encodeURIComponent(period.value));
      const t = data.totals || {};
      const totals = [["Requests", num(t.requests)], ["Input tokens", num(t.input_tokens)],
        ["Output tokens", num(t.output_tokens)], ["Cache-read tokens", num(t.cache_read_tokens)],
        ["Error rate", pct(t.error_rate)], ["TTFT p50", secs(t.ttft_p50)], ["TTFT p95", secs(t.ttft_p95)],
        ["Prompt-cache hit rate", pct(t.cache_hit_rate)]];
      $("totals").replaceChildren(...totals.map(([k, v]) => {
        const box = el("div");
        box.append(el("dt", k), el("dd", v));
        return box;
      }));
      const s = data.series || [];
      const xs = s.map((p) => seconds(p.t));
      const col = (name) => s.map((p) => p[name] ?? null);
      chart("chart-requests", ["requests", "errors"], xs, [col("requests"), col("errors")]);
      chart("chart-tokens", ["input", "output", "cache read"], xs, [col("input_tokens"), col("output_tokens"), col("cache_read_tokens")]);
      chart("chart-ttft", ["p50", "p95"], xs, [col("ttft_p50"), col("ttft_p95")], { sparse: true });
      chart("chart-rates", ["error rate", "cache hit rate"], xs, [col("error_rate"), col("cache_hit_rate")],
        { sparse: true, percent: true });
    }, true);
    period.addEventListener("change", restart);
  }

  // A usage group: {group, name, ...} (a key's id and name) or a plain value.
  const groupId = (g) => (g && typeof g === "object" ? g.group : g);
  function groupName(g) {
    const label = g && typeof g === "object" ? g.name || g.group : g;
    return label === null || label === undefined || label === "" ? "(none)" : String(label);
  }

  function usage() {
    const controls = ["usage-period", "usage-bucket", "usage-group", "usage-metric"].map($);
    const restart = live(async () => {
      const [period, bucket, group, metric] = controls.map((c) => c.value);
      const query = new URLSearchParams({ period, bucket, group_by: group }).toString();
      $("usage-csv").href = "/console/data/usage.csv?" + query;
      const data = await getJSON("/console/data/usage?" + query);
      const rows = data.series || [];
      const groups = data.groups || [];
      const ids = groups.map(groupId);
      const xs = data.buckets || [...new Set(rows.map((r) => seconds(r.t)))].sort((a, b) => a - b);
      const at = new Map(xs.map((x, i) => [x, i]));
      const raw = ids.map(() => xs.map(() => 0));
      for (const r of rows) {
        const g = ids.indexOf(r.group);
        if (g >= 0 && at.has(seconds(r.t))) raw[g][at.get(seconds(r.t))] += r[metric] || 0;
      }
      const stacked = raw.map((_, g) => xs.map((__, i) => raw.slice(0, g + 1).reduce((acc, arr) => acc + arr[i], 0)));
      chart("chart-usage", groups.map(groupName), xs, stacked, { stacked: true, raw });
      fillRows($("usage-table").tBodies[0], groups, (g) => [
        [groupName(g)], [num(g.requests), "num"], [num(g.input_tokens), "num"], [num(g.output_tokens), "num"],
        [num(g.cache_read_tokens), "num"]]);
    }, false);
    for (const c of controls) c.addEventListener("change", restart);
  }

  function health(healthy) {
    if (healthy === null || healthy === undefined) return ["unknown"];
    return healthy ? ["healthy", "ok"] : ["passed over", "bad"];
  }

  function replicas() {
    live(async () => {
      const data = await getJSON("/console/data/replicas");
      const rows = (data.upstreams || []).flatMap((u) => (u.replicas || []).map((r) => [u.name, r]));
      fillRows($("replicas-table").tBodies[0], rows, ([upstream, r]) => [
        [upstream], [r.name], health(r.healthy), [num(r.in_flight), "num"],
        [num(r.running), "num"], [num(r.waiting), "num"], [pct(r.kv_cache_usage), "num"],
        [Object.entries(r.decisions || {}).map(([k, v]) => k + ": " + v).join(", ") || "–"], [num(r.requests), "num"],
        [num(r.errors), "num"], [pct(r.cache_hit_rate), "num"]]);
    }, true);
  }

  function requests() {
    const toggle = $("failures-first");
    const restart = live(async () => {
      const data = await getJSON("/console/data/requests?failures_first=" + (toggle.checked ? "1" : "0"));
      fillRows($("requests-table").tBodies[0], data.data || [], (r) => [
        [when(r.time)], [r.key_name || r.key_id || "–"], [r.model || "–"], [r.upstream || "–"], [r.replica || "–"],
        [r.status, r.status >= 400 ? "bad num" : "num"], [r.error_type || ""], [num(r.input_tokens), "num"],
        [num(r.output_tokens), "num"], [num(r.cache_read_tokens), "num"], [num(r.duration), "num"], [num(r.ttft), "num"]]);
    }, true);
    toggle.addEventListener("change", restart);
  }

  function dollars(cents) {
    return cents === null || cents === undefined ? "–" : "$" + (Number(cents) / 100).toFixed(2);
  }

  function me() {
    live(async () => {
      const data = await getJSON("/console/data/me");
      const key = data.key || {};
      const limits = Object.entries(key.limits || {}).map(([k, v]) => [k.replaceAll("_", " "), num(v)]);
      const budget = key.budget || null;
      pairs($("me-key"), [["Name", key.name], ["Id", key.id], ["Tenant", key.tenant || "–"], ["Status", key.status || "active"],
        ["Models", key.models ? key.models.join(", ") : "all"], ...limits,
        ["Budget", budget ? dollars(budget.amount) + " per " + budget.period : "none"],
        ["Budget used", dollars(key.budget_used)], ["Budget remaining", dollars(key.budget_remaining)]]);
      const u = data.usage || {};
      const t = u.totals || {};
      pairs($("me-usage"), [["Requests", num(t.requests)], ["Input tokens", num(t.input_tokens)],
        ["Output tokens", num(t.output_tokens)], ["Cache-read tokens", num(t.cache_read_tokens)],
        ["Errors", num(t.errors)], ["Prompt-cache hit rate", pct(t.cache_hit_rate)]]);
      const s = u.series || [];
      chart("chart-me", ["input", "output"], s.map((p) => seconds(p.t)), [s.map((p) => p.input_tokens), s.map((p) => p.output_tokens)]);
    }, true);
  }

  // ---- keys ----
  function keyRow(k) {
    const budget = k.budget || null;
    const used = budget && budget.used !== null && budget.used !== undefined ? Number(budget.used) : null;
    return {
      ...k,
      used,
      remaining: budget && used !== null ? Math.max(Number(budget.amount) - used, 0) : null,
      limitsText: Object.entries(k.limits || {}).map(([n, v]) => n.replaceAll("_", " ") + " " + v).join(", "),
    };
  }

  function keys() {
    let all = [];
    let sort = { field: "name", dir: 1 };
    const table = $("keys-table");

    const render = () => {
      const q = $("key-search").value.trim().toLowerCase();
      const shown = all.filter((k) => !q || [k.name, k.tenant, k.id, k.status].some((v) => v && v.toLowerCase().includes(q)));
      const sortValue = (k) => (sort.field === "limits" ? k.limitsText : k[sort.field]);
      shown.sort((a, b) => {
        const x = sortValue(a), y = sortValue(b);
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sort.dir;
      });
      for (const th of table.tHead.rows[0].cells) {
        const button = th.querySelector("button.sort");
        if (button) th.setAttribute("aria-sort", button.dataset.sort === sort.field ? (sort.dir > 0 ? "ascending" : "descending") : "none");
      }
      fillRows(table.tBodies[0], shown, (k) => [
        [k.name], [k.tenant || "–"], [k.status, k.status === "active" ? "ok" : "bad"], [k.limitsText || "–"],
        [dollars(k.used), "num"], [dollars(k.remaining), "num"], [when(k.last_used_at)], [when(k.expires_at)], [actions(k)]]);
    };

    const actions = (k) => {
      const box = el("span");
      if (k.source === "config") {
        box.append(el("span", "from the configuration", "help"));
        return box;
      }
      const edit = el("button", "Edit", "secondary");
      edit.type = "button";
      edit.setAttribute("aria-label", "Edit " + k.name);
      edit.addEventListener("click", () => open(k));
      box.append(edit, " ");
      const revoke = k.status === "active";
      const change = el("button", revoke ? "Revoke" : "Activate", revoke ? "danger" : "secondary");
      change.type = "button";
      change.dataset.testid = revoke ? "key-revoke" : "key-activate";
      change.setAttribute("aria-label", (revoke ? "Revoke " : "Activate ") + k.name);
      change.addEventListener("click", async () => {
        if (revoke && !confirm("Revoke the key " + k.name + "? Requests with it will get 401.")) return;
        try {
          await postJSON("/console/data/keys/" + encodeURIComponent(k.id), { status: revoke ? "inactive" : "active" });
          say((revoke ? "Revoked " : "Activated ") + k.name);
          await load();
        } catch (e) { say(e.message, true); }
      });
      box.append(change);
      return box;
    };

    const load = async () => {
      all = (await getJSON("/console/data/keys")).data.map(keyRow);
      render();
    };

    const open = keyForm(() => load());
    secretShown();
    $("key-search").addEventListener("input", render);
    for (const button of table.querySelectorAll("button.sort")) {
      button.addEventListener("click", () => {
        sort = { field: button.dataset.sort, dir: sort.field === button.dataset.sort ? -sort.dir : 1 };
        render();
      });
    }
    live(load, false);
  }

  // The create/edit dialog: its fields as the Admin API's body; a new key's secret shown once.
  function keyForm(load) {
    const dialog = $("key-form");
    const form = $("key-form-fields");
    const error = $("key-form-error");
    const open = (k) => {
      form.reset();
      error.hidden = true;
      const f = form.elements;
      f.id.value = k ? k.id : "";
      $("key-form-title").textContent = k ? "Edit " + k.name : "Create key";
      $("key-create-submit").textContent = k ? "Save" : "Create";
      f.tenant.disabled = !!k;
      if (k) {
        f.name.value = k.name;
        f.tenant.value = k.tenant || "";
        f.models.value = (k.models || []).join(", ");
        for (const input of form.querySelectorAll("input.limit")) input.value = (k.limits || {})[input.name] || "";
        if (k.budget) {
          f.budget.value = (Number(k.budget.amount) / 100).toFixed(2);
          f.period.value = k.budget.period;
        }
      }
      dialog.showModal();
      f.name.focus();
    };

    const body = () => {
      const f = form.elements;
      const limits = {};
      for (const input of form.querySelectorAll("input.limit")) if (input.value) limits[input.name] = Number(input.value);
      const models = f.models.value.split(",").map((m) => m.trim()).filter(Boolean);
      const made = {
        name: f.name.value.trim(),
        limits: Object.keys(limits).length ? limits : null,
        models: models.length ? models : null,
        budget: f.budget.value !== "" ? { amount: String(Math.round(Number(f.budget.value) * 100)), currency: "USD", period: f.period.value } : null,
      };
      if (!f.id.value && f.tenant.value.trim()) made.tenant = f.tenant.value.trim();
      return made;
    };

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const id = form.elements.id.value;
      try {
        const made = await postJSON("/console/data/keys" + (id ? "/" + encodeURIComponent(id) : ""), body());
        dialog.close();
        if (!id) {
          $("key-secret").textContent = made.key;
          $("key-made").hidden = false;
          $("key-copy").focus();
        }
        say((id ? "Saved " : "Created ") + made.name);
        await load();
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
      }
    });
    $("key-form-cancel").addEventListener("click", () => dialog.close());
    $("key-create").addEventListener("click", () => open(null));
    return open;
  }

  // The new key's secret: a copy button, and Done to take it off the page for good.
  function secretShown() {
    $("key-copy").addEventListener("click", async () => {
      const secret = $("key-secret").textContent;
      try {
        await navigator.clipboard.writeText(secret);
      } catch {
        const range = document.createRange();
        range.selectNodeContents($("key-secret"));
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        document.execCommand("copy");
      }
      say("Copied the key to the clipboard");
    });
    $("key-made-close").addEventListener("click", () => {  // shown once: gone from the page
      $("key-secret").textContent = "";
      $("key-made").hidden = true;
    });
  }

  function signout() {
    const button = $("signout");
    if (!button) return;
    button.addEventListener("click", async () => {
      try {
        await fetch("/console/signout", { method: "POST", credentials: "same-origin", headers: { "x-csrf-token": csrf() } });
      } finally {
        location.assign("/console/signin");
      }
    });
  }

  const VIEWS = { overview, usage, replicas, requests, me, keys };
  document.addEventListener("DOMContentLoaded", () => {
    signout();
    const view = VIEWS[document.body.dataset.view];
    if (view) view();
  });
})();
