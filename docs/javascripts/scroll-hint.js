// A table or chart wider than its column says so: a line above it, "scroll sideways",
// wherever it does not fit (a phone, or a collapsed block opened). Checked again when the
// window resizes or a block opens.
(function () {
  var WIDE = ".md-typeset__scrollwrap, .md-typeset p:has(> img[src$='chart-benchmarks.svg'])";
  function mark() {
    document.querySelectorAll(WIDE).forEach(function (wrap) {
      var wide = wrap.scrollWidth > wrap.clientWidth + 1;
      var hint = wrap.previousElementSibling;
      var has = hint !== null && hint.classList.contains("scroll-hint");
      if (wide && !has) {
        var p = document.createElement("p");
        p.className = "scroll-hint";
        var what = wrap.tagName === "P" ? "chart" : "table";
        p.textContent = "Wider than the screen: scroll the " + what + " sideways \u2192";
        wrap.parentNode.insertBefore(p, wrap);
      } else if (!wide && has) {
        hint.remove();
      }
    });
  }
  if (window.document$) {
    window.document$.subscribe(function () { requestAnimationFrame(mark); });
  } else {
    window.addEventListener("load", mark);
  }
  window.addEventListener("resize", mark);
  document.addEventListener("toggle", mark, true);
})();
