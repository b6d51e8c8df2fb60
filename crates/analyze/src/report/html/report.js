// memleak's HTML report: draws the timeline chart, switches the
// flamegraphs and sorts the stacks table. Plain JavaScript, no library:
// the page must work offline, from a file.
"use strict";

(function () {
  var SVG_NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  function el(name, attrs, parent) {
    var e = document.createElementNS(SVG_NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // A step of 1, 2 or 5 times a power of ten that cuts `span` in about
  // `parts` pieces.
  function niceStep(span, parts) {
    var raw = span / parts;
    var pow = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / pow;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * pow;
  }

  function trim(v) {
    return String(Number(v.toPrecision(6)));
  }

  // Bytes with the binary unit that fits the largest value of the axis.
  function byteUnit(max) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    var i = 0;
    while (max >= 1024 && i + 1 < units.length) { max /= 1024; i++; }
    return { name: units[i], div: Math.pow(1024, i) };
  }

  function timeUnit(max) {
    if (max >= 1e9) return { name: "s", div: 1e9 };
    if (max >= 1e6) return { name: "ms", div: 1e6 };
    if (max >= 1e3) return { name: "µs", div: 1e3 };
    return { name: "ns", div: 1 };
  }

  // Outstanding bytes over time: the total and the top stacks, one point
  // at the end of each window.
  function drawTimeline(data) {
    var box = document.getElementById("timeline-chart");
    if (!box) return;
    var tl = data.timeline;
    if (!tl || !tl.total.length) {
      box.setAttribute("data-rendered", "none");
      return;
    }
    var series = [{ label: "total (after filters)", samples: tl.total, total: true }]
      .concat(data.series.filter(function (s) { return s.samples.length; }));
    var n = tl.total.length;
    var W = 1000, H = 360, left = 78, right = 16, top = 14, bottom = 44;
    var t0 = tl.start_ns, t1 = tl.start_ns + n * tl.window_ns;
    var ymax = 0;
    series.forEach(function (s) {
      s.samples.forEach(function (v) { if (v > ymax) ymax = v; });
    });
    var yu = byteUnit(ymax || 1);
    var ystep = niceStep((ymax || 1) / yu.div, 5) * yu.div;
    var ytop = Math.max(ystep, Math.ceil(ymax / ystep) * ystep);
    var tu = timeUnit(t1);
    var xstep = niceStep((t1 - t0) / tu.div || 1, 8) * tu.div;
    function x(t) { return left + (t - t0) / Math.max(1, t1 - t0) * (W - left - right); }
    function y(v) { return top + (1 - v / ytop) * (H - top - bottom); }

    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": "outstanding bytes over time" });
    var grid = el("g", { "class": "grid" }, svg);
    var axes = el("g", { "class": "axis" }, svg);
    for (var v = 0; v <= ytop * 1.0000001; v += ystep) {
      el("line", { x1: left, x2: W - right, y1: y(v), y2: y(v) }, grid);
      el("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, axes)
        .textContent = trim(v / yu.div) + " " + yu.name;
    }
    var first = Math.ceil(t0 / xstep) * xstep;
    for (var t = first; t <= t1 + xstep * 1e-6; t += xstep) {
      el("line", { x1: x(t), x2: x(t), y1: H - bottom, y2: H - bottom + 5 }, axes);
      el("text", { x: x(t), y: H - bottom + 18, "text-anchor": "middle" }, axes)
        .textContent = trim(t / tu.div) + " " + tu.name;
    }
    el("line", { x1: left, x2: W - right, y1: H - bottom, y2: H - bottom }, axes);
    el("line", { x1: left, x2: left, y1: top, y2: H - bottom }, axes);
    el("text", { x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle" }, axes)
      .textContent = "time since the recording started (" + tu.name + ")";
    el("text", { x: 14, y: (top + H - bottom) / 2, "text-anchor": "middle",
      transform: "rotate(-90 14 " + (top + H - bottom) / 2 + ")" }, axes)
      .textContent = "outstanding bytes (" + yu.name + ")";

    var legend = document.createElement("div");
    legend.className = "legend";
    series.forEach(function (s, i) {
      var color = s.total ? "#1d2330" : COLORS[(i - 1) % COLORS.length];
      var pts = s.samples.map(function (v, j) {
        return x(t0 + (j + 1) * tl.window_ns).toFixed(1) + "," + y(v).toFixed(1);
      });
      var line = el("polyline", { points: pts.join(" "), stroke: color,
        "class": "series" + (s.total ? " total" : "") }, svg);
      el("title", {}, line).textContent = s.label;
      var item = document.createElement("span");
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.label));
      legend.appendChild(item);
    });
    box.textContent = "";
    box.appendChild(svg);
    box.appendChild(legend);
    box.setAttribute("data-rendered", String(series.length));
  }

  // The flamegraphs: one iframe each, loaded on first view from the SVG
  // embedded (base64) in the page, so that each runs inferno's script in
  // its own document.
  function setupFlamegraphs() {
    var buttons = document.querySelectorAll(".toggle button[data-weight]");
    var frames = {};
    document.querySelectorAll("iframe.flamegraph").forEach(function (f) {
      frames[f.getAttribute("data-weight")] = f;
    });
    var section = document.getElementById("flamegraph");
    var colourButtons = document.querySelectorAll(".toggle button[data-colour]");
    function colour() { return section.getAttribute("data-colour"); }
    function coloured(f, m) {
      f.setAttribute("data-coloured", String(m.memleakColoured));
      f.setAttribute("data-definitely", String(m.definitely));
      f.setAttribute("data-growing", String(m.growing));
    }
    function paint(f) {
      if (f.contentWindow && f.getAttribute("data-rendered")) {
        f.contentWindow.postMessage({ memleakColour: colour() }, "*");
      }
    }
    function setColour(mode) {
      section.setAttribute("data-colour", mode);
      colourButtons.forEach(function (b) {
        b.setAttribute("aria-pressed", String(b.getAttribute("data-colour") === mode));
      });
      for (var w in frames) paint(frames[w]);
    }
    colourButtons.forEach(function (b) {
      b.addEventListener("click", function () { setColour(b.getAttribute("data-colour")); });
    });
    setColour(colour());
    window.addEventListener("message", function (e) {
      var m = e.data;
      if (!m || typeof m !== "object") return;
      for (var w in frames) {
        var f = frames[w];
        if (f.contentWindow !== e.source) continue;
        if ("memleakFlamegraph" in m) {
          if (m.height > 0) f.style.height = Math.ceil(m.height) + 4 + "px";
          f.setAttribute("data-frames", String(m.frames));
          f.setAttribute("data-rendered", "true");
          coloured(f, m.coloured);
          // The colours may have changed while it loaded.
          if (m.coloured.memleakColoured !== colour()) paint(f);
        } else if ("memleakColoured" in m) {
          coloured(f, m);
        }
      }
    });
    function load(f) {
      if (f.getAttribute("src")) return;
      // Lay the frame out first (reading its width does): inferno sizes
      // the flamegraph to the frame's width as it loads, and a width of 0
      // is an error.
      if (!f.offsetWidth) return;
      var src = document.getElementById(f.getAttribute("data-source"));
      var bin = atob(src.textContent.trim());
      var bytes = new Uint8Array(bin.length);
      for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      f.src = URL.createObjectURL(new Blob([bytes], { type: "image/svg+xml" })) +
        "#colour=" + colour();
    }
    function show(weight) {
      buttons.forEach(function (b) {
        b.setAttribute("aria-pressed", String(b.getAttribute("data-weight") === weight));
      });
      for (var w in frames) {
        frames[w].classList.toggle("shown", w === weight);
        if (w === weight) load(frames[w]);
      }
    }
    buttons.forEach(function (b) {
      b.addEventListener("click", function () { show(b.getAttribute("data-weight")); });
    });
    var initial = /(?:^|[#&])flamegraph=([a-z-]+)/.exec(location.hash);
    show(initial && frames[initial[1]] ? initial[1] : "bytes");
  }

  // Click a header to sort by it; again to reverse. Cells sort by their
  // data-v (numbers) or their text.
  function setupSort() {
    var table = document.querySelector("table.stacks");
    if (!table) return;
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      th.addEventListener("click", function () {
        var desc = th.getAttribute("aria-sort") !== "descending";
        var numeric = th.hasAttribute("data-numeric");
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", desc ? "descending" : "ascending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        function key(r) {
          var c = r.cells[col];
          var v = c.getAttribute("data-v");
          if (numeric) return v === null || v === "" ? -Infinity : Number(v);
          return (v !== null ? v : c.textContent).toLowerCase();
        }
        rows.sort(function (a, b) {
          var ka = key(a), kb = key(b);
          var c = ka < kb ? -1 : ka > kb ? 1 : 0;
          return desc ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  var data = JSON.parse(document.getElementById("memleak-data").textContent);
  drawTimeline(data);
  setupFlamegraphs();
  setupSort();
  // Where the leak summary was laid out, for a check that it is in the
  // first screen.
  var leak = document.getElementById("leak-summary");
  if (leak) {
    var box = leak.getBoundingClientRect();
    leak.setAttribute("data-bottom", String(Math.ceil(box.bottom + window.scrollY)));
  }
  document.body.setAttribute("data-rendered", "true");
})();
