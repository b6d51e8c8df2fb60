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
  // Tell the report page what was drawn and how tall it is.
  window.addEventListener("load", function () {
    var svg = document.documentElement;
    parent.postMessage({
      memleakFlamegraph: true,
      frames: document.querySelectorAll("#frames > g").length,
      height: svg.height && svg.height.baseVal ? svg.height.baseVal.value : 0
    }, "*");
  });
})();
