// Added by memleak to each flamegraph it embeds in its HTML report.
(function () {
  // inferno keeps the zoom in the page's address; an embedded document's
  // address (blob:) cannot take it. Zooming works without it.
  var replace = history.replaceState;
  history.replaceState = function () {
    try {
      replace.apply(history, arguments);
    } catch (e) {
      // Not keeping the zoom in the address is fine.
    }
  };
  // Colour the frames as the page asks: by function (inferno's), by leak
  // verdict or by growth (the data-verdict and data-growth of each rect,
  // filled by the style sheet memleak added). The first colours come in
  // the address (#colour=verdict), later ones by message; each is said
  // back with how many frames are definitely lost and growing.
  function colour(mode) {
    var root = document.documentElement;
    root.classList.remove("by-verdict", "by-growth");
    if (mode === "verdict" || mode === "growth") root.classList.add("by-" + mode);
    return {
      memleakColoured: mode,
      definitely: document.querySelectorAll('rect[data-verdict="definitely"]').length,
      growing: document.querySelectorAll('rect[data-growth="growing"]').length
    };
  }
  window.addEventListener("message", function (e) {
    var m = e.data;
    if (!m || typeof m !== "object" || !("memleakColour" in m)) return;
    parent.postMessage(colour(String(m.memleakColour)), "*");
  });
  // Tell the report page what was drawn and how tall it is.
  window.addEventListener("load", function () {
    var svg = document.documentElement;
    var first = /[#&]colour=([a-z]+)/.exec(location.hash);
    var coloured = colour(first ? first[1] : "function");
    parent.postMessage({
      memleakFlamegraph: true,
      coloured: coloured,
      frames: document.querySelectorAll("#frames > g").length,
      height: svg.height && svg.height.baseVal ? svg.height.baseVal.value : 0
    }, "*");
  });
})();
