"use strict";
// The status page's live part (src/server/status.rs renders the first paint). Every 2 s it
// fetches /debug/queue and /debug/backends and rewrites the cells the server rendered: each
// cell names its value's JSON pointer (data-p) and format (data-f), the same formats as
// status.rs's `Format`. Text goes in through textContent only, never as markup.
(function () {
  var PERIOD_MS = 2000;
  var HISTORY = 150; // samples kept per model: 5 minutes at PERIOD_MS
  var history = {};

  function get(value, pointer) {
    if (!pointer) return value;
    var parts = pointer.split("/").slice(1);
    for (var i = 0; i < parts.length; i++) {
      if (value === null || value === undefined) return null;
      value = value[parts[i]];
    }
    return value === undefined ? null : value;
  }

  function state(row) {
    if (!row.live) return "removed";
    if (row.ejected) return "ejected";
    return row.healthy ? "up" : "down";
  }

  function format(value, kind) {
    if (kind === "state") return state(value);
    if (value === null || value === undefined) return "\u2013";
    switch (kind) {
      case "ms":
        return value < 1000 ? value.toFixed(0) + " ms" : (value / 1000).toFixed(1) + " s";
      case "pct":
        return (value * 100).toFixed(1) + " %";
      case "rate":
        return value.toFixed(0);
      case "bool":
        return value ? "yes" : "no";
      default:
        return String(value);
    }
  }

  function fill(cell, row) {
    var text = format(get(row, cell.getAttribute("data-p")), cell.getAttribute("data-f"));
    cell.textContent = text;
    cell.setAttribute("data-v", text);
  }

  // A table body rebuilt from `rows`, one cell per heading that names a pointer.
  function rebuild(table, rows) {
    var heads = table.querySelectorAll("thead th");
    var body = document.createElement("tbody");
    rows.forEach(function (row) {
      var tr = body.insertRow();
      heads.forEach(function (th) {
        var td = tr.insertCell();
        td.setAttribute("data-p", th.getAttribute("data-p") || "");
        td.setAttribute("data-f", th.getAttribute("data-f") || "");
        fill(td, row);
      });
    });
    table.replaceChild(body, table.tBodies[0]);
  }

  function sparkline(svg, values, label) {
    var NS = "http://www.w3.org/2000/svg";
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var max = Math.max.apply(null, values.concat([1]));
    var step = 300 / (HISTORY - 1);
    var x0 = 300 - step * (values.length - 1);
    var points = values.map(function (v, i) {
      return (x0 + i * step).toFixed(1) + "," + (58 - (v / max) * 50).toFixed(1);
    });
    var line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", points.join(" "));
    svg.appendChild(line);
    var text = document.createElementNS(NS, "text");
    text.setAttribute("x", "2");
    text.setAttribute("y", "12");
    text.textContent = label + " (max " + (Math.round(max * 10) / 10) + ")";
    svg.appendChild(text);
  }

  function chart(card, model, now) {
    var name = model.model;
    var h = history[name] || (history[name] = []);
    var admitted = 0;
    Object.keys(model.admitted).forEach(function (lane) { admitted += model.admitted[lane]; });
    h.push({ t: now, queued: model.queued, admitted: admitted });
    if (h.length > HISTORY) h.shift();
    var rates = [];
    for (var i = 1; i < h.length; i++) {
      var seconds = Math.max((h[i].t - h[i - 1].t) / 1000, 0.001);
      rates.push(Math.max(h[i].admitted - h[i - 1].admitted, 0) / seconds);
    }
    var charts = card.querySelectorAll("svg.spark");
    sparkline(charts[0], h.map(function (s) { return s.queued; }), "queued");
    sparkline(charts[1], rates, "admitted / s");
  }

  function models(queue, now) {
    var cards = document.querySelectorAll("section.model");
    if (cards.length !== queue.models.length) return false;
    for (var i = 0; i < cards.length; i++) {
      var model = queue.models[i];
      if (cards[i].getAttribute("data-model") !== model.model) return false;
      // Every cell of the card but the oldest-waiting rows (rebuilt below); the table's
      // caption holds a count of the model's own.
      cards[i].querySelectorAll("[data-p]:not(th)").forEach(function (cell) {
        if (!cell.closest("table.waiting > tbody")) fill(cell, model);
      });
      rebuild(cards[i].querySelector("table.waiting"), model.oldest_waiting);
      chart(cards[i], model, now);
    }
    return true;
  }

  function poll() {
    var status = document.getElementById("live");
    Promise.all(["/debug/queue", "/debug/backends"].map(function (path) {
      return fetch(path, { cache: "no-store" }).then(function (r) {
        if (!r.ok) throw new Error(path + ": " + r.status);
        return r.json();
      });
    })).then(function (docs) {
      var now = Date.now();
      if (!models(docs[0], now)) {
        location.reload(); // a reload added or removed models: render afresh
        return;
      }
      rebuild(document.getElementById("backends"), docs[1].backends);
      status.textContent = "live, updated " + new Date(now).toLocaleTimeString();
      status.setAttribute("data-v", "live");
    }).catch(function (error) {
      status.textContent = "not updating: " + error.message;
      status.setAttribute("data-v", "down");
    }).then(function () {
      setTimeout(poll, PERIOD_MS);
    });
  }

  poll();
})();
